"""Puts the benchmark results into the site as they are in benches/results, at build time.

Each `benches/results/<name>.md` becomes the page `results/<name>.md`, and each chart beside
them (`<name>.png`) is shown on its page, so the site's figures are always the committed
ones and there is no second copy to keep in step.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files

RESULTS = Path(__file__).resolve().parents[2] / "benches" / "results"


def on_files(files: Files, config) -> Files:  # noqa: ANN001 (mkdocs' config type)
    for page in sorted(RESULTS.glob("*.md")):
        text = page.read_text()
        chart = page.with_suffix(".png")
        if chart.exists():
            text += f"\n\n## Chart\n\n![{page.stem}]({chart.name})\n"
        text += f"\n\n*From `benches/results/{page.name}` in the repository.*\n"
        files.append(File.generated(config, f"results/{page.name}", content=text))
    for chart in sorted(RESULTS.glob("*.png")):
        files.append(File.generated(config, f"results/{chart.name}", content=chart.read_bytes()))
    return files
