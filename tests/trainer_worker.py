"""One rank of the trainer tests (tests/test_trainers.py): trains a 2-layer GPT-2 (built
from a config, nothing downloaded) on shardflow data with HF Trainer, an accelerate loop
or Lightning, and logs every row id it trains on, with its epoch and step. Started as a
plain process with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set, as
torchrun sets them (one process: no distributed run).

    python trainer_worker.py SPEC_JSON

SPEC: framework ("trainer" | "accelerate" | "lightning"), data (a Parquet path with
`id` and `input_ids` columns), out (a folder), epochs, batch_size (per rank), workers
(torch DataLoader workers), mode ("samples": the adapter yields samples and the
framework batches them; "batches": the adapter batches; "weighted": a MapDataset of a
weighted_sample, read through the framework's sampler; "packed": the `input_ids`, `labels`
and `seq_ids` token columns packed into rows of `seq_length` tokens, batched by
shardflow.torch.padding_free for a 2-layer Llama, with max_steps), shuffle, adapter (extra
keyword arguments of the adapter), kill_at (a global step: save a checkpoint there,
then exit at once, as a killed run), resume (resume from the checkpoint in out).
Each rank writes out/log-RANK.jsonl: one line per step, {"epoch", "step", "ids"}.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

import shardflow as sf
from shardflow.torch import IterableDataset

# (Imported by a test for its models, it runs nothing and has no spec.)
SPEC: dict[str, Any] = json.loads(sys.argv[1]) if __name__ == "__main__" else {"out": "."}
OUT = Path(SPEC["out"])
RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
LOG = OUT / f"log-{RANK}.jsonl"


def tiny_gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2, tie_word_embeddings=False)
    return GPT2LMHeadModel(config)


class Logged(torch.nn.Module):
    """GPT-2 that records the row ids of every batch it trains on."""

    def __init__(self) -> None:
        super().__init__()
        self.gpt = tiny_gpt2()
        self.epoch = 0
        self.step = 0

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, row_id: torch.Tensor) -> Any:
        if self.training:
            with LOG.open("a") as log:
                log.write(json.dumps({"epoch": self.epoch, "step": self.step, "ids": row_id.tolist()}) + "\n")
            self.step += 1
        return self.gpt(input_ids=input_ids, labels=labels)


def tiny_llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=256,
    )
    return LlamaForCausalLM(config)


class LoggedPacks(torch.nn.Module):
    """A 2-layer Llama fed padding-free batches of packs, logging the sequences (by
    `row_id`, each sequence's id) of every step and its loss."""

    def __init__(self) -> None:
        super().__init__()
        self.llama = tiny_llama()
        self.epoch = 0
        self.step = 0

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, position_ids: torch.Tensor,
                row_id: torch.Tensor, **attention: Any) -> Any:
        # No cache: with one, transformers' sdpa attention does not keep packed sequences apart.
        out = self.llama(input_ids=input_ids, labels=labels, position_ids=position_ids, use_cache=False, **attention)
        if self.training:
            with LOG.open("a") as log:
                log.write(json.dumps({"epoch": self.epoch, "step": self.step, "ids": row_id.tolist(),
                                      "tokens": int(input_ids.shape[1]), "loss": out.loss.item()}) + "\n")
            self.step += 1
        return out


def packed_collator(examples: list[dict[str, Any]]) -> dict[str, Any]:
    """shardflow.torch.padding_free, and each sequence's id (its first token's `seq_ids`)."""
    from shardflow.torch import padding_free

    batch = padding_free([{k: v for k, v in e.items() if k != "seq_ids"} for e in examples])
    seq_ids = torch.cat([torch.as_tensor(e["seq_ids"]).reshape(-1) for e in examples])
    batch["row_id"] = seq_ids[batch["position_ids"][0] == 0]
    return batch


def adapter() -> Any:
    if SPEC["mode"] == "packed":
        columns = ["input_ids", "labels", "seq_ids"]
        ds = sf.dataset(SPEC["data"]).pack(SPEC["seq_length"], columns=columns, buffer_rows=SPEC["buffer_rows"])
        return IterableDataset(ds, shuffle=True, seed=3)
    if SPEC["mode"] == "weighted":
        # A map-style dataset read through the framework's own sampler.
        from shardflow.torch import MapDataset

        from trainer_worker_draws import weighted

        return MapDataset(weighted(SPEC["data"]).map(lambda row: {"labels": row["input_ids"]}))
    ds = sf.dataset(SPEC["data"]).rename_column("id", "row_id")
    batch_size = SPEC["batch_size"] if SPEC["mode"] == "batches" else None
    ds = ds.map(lambda row: {"labels": row["input_ids"]})
    return IterableDataset(ds, batch_size=batch_size, shuffle=SPEC.get("shuffle", True), **SPEC.get("adapter", {}))


def loader_batch_size() -> int | None:
    return None if SPEC["mode"] == "batches" else SPEC["batch_size"]


def run_trainer() -> None:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    packed = SPEC["mode"] == "packed"
    model = LoggedPacks() if packed else Logged()

    class Epochs(TrainerCallback):
        begun = 0

        def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            # With max_steps and no length, Trainer counts state.epoch in max_steps (an
            # epoch of packs is 0.5 of two): the epochs begun tell them apart.
            model.epoch = self.begun if packed else int(state.epoch or 0)
            self.begun += 1
            model.step = state.global_step

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            model.step = state.global_step
            if SPEC.get("kill_at") == state.global_step:
                control.should_save = True
            return control

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if SPEC.get("kill_at") == state.global_step:
                if torch.distributed.is_initialized():
                    torch.distributed.barrier()  # every rank's part of the checkpoint is written
                os._exit(0)

    args = TrainingArguments(
        output_dir=str(OUT / "checkpoints"),
        per_device_train_batch_size=SPEC["batch_size"],
        num_train_epochs=SPEC["epochs"],
        dataloader_num_workers=SPEC["workers"],
        learning_rate=1e-3,
        save_strategy="no",
        logging_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        # Padding-free batches ([1, tokens]) differ in length, so accelerate's dispatch
        # (process 0 reads, concatenates and slices every step's batches) cannot carry
        # them: each process collates its own slice of the packs.
        # The collator needs the packs' `seq_lengths` and `seq_ids`, which the model
        # does not take.
        **(dict(max_steps=SPEC["max_steps"], accelerator_config={"dispatch_batches": False},
                remove_unused_columns=False) if packed else {}),
    )
    trainer = Trainer(
        model=model, args=args, train_dataset=adapter(), callbacks=[Epochs()],
        **(dict(data_collator=packed_collator) if packed else {}),
    )
    checkpoint = None
    if SPEC.get("resume"):
        checkpoint = str(sorted((OUT / "checkpoints").glob("checkpoint-*"))[-1])
    trainer.train(resume_from_checkpoint=checkpoint)


def run_accelerate() -> None:
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    stateful = SPEC.get("stateful", False)
    config = DataLoaderConfiguration(use_stateful_dataloader=stateful, **SPEC.get("accelerate", {}))
    accelerator = Accelerator(cpu=True, dataloader_config=config)
    model = Logged()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if stateful:
        from torchdata.stateful_dataloader import StatefulDataLoader as Loader
    else:
        from torch.utils.data import DataLoader as Loader
    # A map-style dataset's rows are batched by transformers' collator, as Trainer's.
    from transformers import default_data_collator

    shuffled = dict(shuffle=True, collate_fn=default_data_collator) if SPEC["mode"] == "weighted" else {}
    loader = Loader(adapter(), batch_size=loader_batch_size(), num_workers=SPEC["workers"], **shuffled)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    inner = accelerator.unwrap_model(model)
    saved = OUT / "accelerate-state"
    step, first_epoch = 0, 0
    if SPEC.get("resume"):
        accelerator.load_state(str(saved))
        step, first_epoch = json.loads((saved / "progress.json").read_text())
    for epoch in range(first_epoch, SPEC["epochs"]):
        loader.set_epoch(epoch)
        inner.epoch = epoch
        for batch in loader:
            inner.step = step
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if SPEC.get("kill_at") == step:
                accelerator.save_state(str(saved))
                accelerator.wait_for_everyone()
                if accelerator.is_main_process:
                    # Every process wrote its loader state to this one file; under the
                    # batch dispatch only process 0's has read anything (README).
                    if stateful:
                        torch.save(loader.state_dict(), saved / "dl_state_dict.bin")
                    (saved / "progress.json").write_text(json.dumps([step, epoch]))
                accelerator.wait_for_everyone()
                os._exit(0)


def run_lightning() -> None:
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = Logged()

        def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
            self.model.epoch = self.current_epoch
            self.model.step = self.global_step
            return self.model(**batch).loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    saved = OUT / "lightning.ckpt"

    class Kill(L.Callback):
        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if SPEC.get("kill_at") == trainer.global_step:
                trainer.save_checkpoint(str(saved))
                trainer.strategy.barrier()
                os._exit(0)

    trainer = L.Trainer(
        accelerator="cpu", devices=WORLD, strategy="ddp" if WORLD > 1 else "auto", max_epochs=SPEC["epochs"],
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[Kill()],
    )
    if SPEC.get("stateful", False):
        from torchdata.stateful_dataloader import StatefulDataLoader as Loader
    else:
        from torch.utils.data import DataLoader as Loader
    # A map-style dataset's rows are batched by transformers' collator, as Trainer's.
    from transformers import default_data_collator

    shuffled = dict(shuffle=True, collate_fn=default_data_collator) if SPEC["mode"] == "weighted" else {}
    loader = Loader(adapter(), batch_size=loader_batch_size(), num_workers=SPEC["workers"], **shuffled)
    trainer.fit(Module(), loader, ckpt_path=str(saved) if SPEC.get("resume") else None)


if __name__ == "__main__":
    {"trainer": run_trainer, "accelerate": run_accelerate, "lightning": run_lightning}[SPEC["framework"]]()
    # Every step is logged (each line written and closed). The rank ends here, without
    # the interpreter's teardown: libtorch's C++ statics (gloo's and the store's threads)
    # sometimes abort it there ("terminate called without an active exception", twice
    # in CI, after destroy_process_group too), which says nothing of the data trained on.
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
