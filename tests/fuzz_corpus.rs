//! Replays every saved fuzz input (the corpora under `fuzz/corpus/` and the findings
//! under `fuzz/regressions/`) through the targets' code, on stable Rust: what the
//! campaign (`bash scripts/fuzz.sh`, nightly) found stays fixed.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

static PANICS: AtomicUsize = AtomicUsize::new(0);

fn inputs(target: &str) -> Vec<std::path::PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut files = Vec::new();
    for folder in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(folder).join(target)) else {
            continue;
        };
        files.extend(entries.map(|e| e.expect("readable corpus folder").path()));
    }
    files.sort();
    files
}

#[test]
fn saved_fuzz_inputs_neither_panic_nor_break_invariants() {
    // A panic caught inside the pipeline becomes an error, which is still a bug: count
    // every panic, caught or not, as the fuzzer (which aborts on them) does, except the
    // parquet crate's asserts on corrupt data, which are reported as the file's errors.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !shardflow::fuzz::tolerated_panic(info) {
            PANICS.fetch_add(1, Ordering::SeqCst);
            default_hook(info);
        }
    }));
    let mut failures = Vec::new();
    let mut replayed = 0;
    for target in shardflow::fuzz::TARGETS {
        let files = inputs(target);
        assert!(
            !files.is_empty(),
            "no saved inputs for fuzz target {target}"
        );
        for file in files {
            let data = std::fs::read(&file).expect("readable corpus file");
            let before = PANICS.load(Ordering::SeqCst);
            let outcome = std::panic::catch_unwind(|| shardflow::fuzz::run(target, &data));
            if outcome.is_err() || PANICS.load(Ordering::SeqCst) != before {
                failures.push(format!("{target}: {}", file.display()));
            }
            replayed += 1;
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {replayed} inputs failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
