"""Does a LoRA run's export work without ptrun? Each run directory's `model/` is loaded by
`benchmarks/without_ptrun/load_export.py` in an interpreter that has torch, transformers and peft but not ptrun, which
classifies the run's eval set: the adapter through `peft.PeftModel.from_pretrained` over the base model, the
merged model (`adapter.merge=true`) through `transformers.pipeline`. The check: its top-1 equals the run's last
eval's, to the sample.

    python -m benchmarks.export_check RUN_DIR [RUN_DIR ...] [--out FILE.json]

The eval set is the run's own: its packaged text source (`data.name`) split by its `data.eval_fraction` and
`data.split_seed`, as the run split it. The ptrun-free interpreter is a venv made for the check whose only
packages are those of the interpreter running this (found through torch's folder, without their `.pth` hooks:
ptrun's editable install is one of them, so ptrun is not importable there; the loader checks).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

from benchmarks.harness import command_line, final_top1, machine_description, markdown_lines, publish

LOADER = Path(__file__).resolve().parent / "without_ptrun" / "load_export.py"


def eval_set(cfg) -> tuple[list[str], list[int]]:
    """The texts and labels of a run's eval split, in the run's order."""
    from ptrun.data.packaged_text import PACKAGED_TEXT, read_packaged_text
    from ptrun.data.splits import stratified_split

    if cfg.data.name not in PACKAGED_TEXT:
        raise SystemExit(f"export_check: data.name={cfg.data.name!r}: only packaged text ({', '.join(PACKAGED_TEXT)})")
    texts, labels = read_packaged_text(cfg.data.name, cfg.data.path)
    _, eval_pos = stratified_split(labels, cfg.data, f"data.name={cfg.data.name}")
    return [texts[i] for i in eval_pos], [int(labels[i]) for i in eval_pos]


def without_ptrun(where: Path) -> Path:
    """A venv at `where` that sees this interpreter's packages but not ptrun; returns its python."""
    import torch

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # A path line in a .pth file only extends sys.path: the .pth files in that folder (ptrun's editable finder
    # among them) are not run, so the packages installed there import and ptrun does not.
    Path(site, "shared_packages.pth").write_text(str(Path(torch.__file__).parents[1]) + "\n")
    return python


def check(run_dir: Path, python: Path, scratch: Path) -> dict:
    from ptrun.config.schema import load_resolved

    cfg = load_resolved(run_dir / "config.yaml")
    kind = "merged" if cfg.adapter.merge else "adapter"
    texts, labels = eval_set(cfg)
    rows = scratch / f"{run_dir.name}_eval.jsonl"
    rows.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in zip(texts, labels, strict=True)))
    cmd = [str(python), str(LOADER), kind, str(run_dir / "model"), "--eval", str(rows)]
    cmd += ["--max-length", str(cfg.data.max_length)]
    if kind == "adapter":
        cmd += ["--base", str(cfg.model.pretrained)]
    print("$ " + " ".join(cmd), flush=True)
    # From the scratch folder: a checkout's ptrun/ in the working directory would be importable.
    printed = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=scratch).stdout
    found = json.loads(printed.splitlines()[-1])
    run_top1 = final_top1(run_dir)
    return {
        "run": str(run_dir),
        "loaded_as": kind,
        "samples": len(labels),
        "run_top1": run_top1,
        "loaded_top1": found["top1"],
        "same": abs(found["top1"] - run_top1) < 1e-9,
    }


def caption(result: dict) -> str:
    return "Each LoRA run's export loaded without ptrun, classifying the run's eval set"


def table(result: dict) -> str:
    header = ("run", "loaded as", "eval samples", "run's last eval top-1", "loaded top-1", "same")
    rows = [
        (
            "/".join(Path(r["run"]).parts[-2:]),
            r["loaded_as"],
            str(r["samples"]),
            f"{r['run_top1']:.2f}%",
            f"{r['loaded_top1']:.2f}%",
            "yes" if r["same"] else "no",
        )
        for r in result["rows"]
    ]
    return "\n".join(markdown_lines(header, rows))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run directories of LoRA runs (adapter=lora)")
    parser.add_argument("--out", type=Path, default=Path("check_lora_export.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ptrun_export_check_") as tmp:
        python = without_ptrun(Path(tmp) / "venv")
        rows = [check(run.resolve(), python, Path(tmp)) for run in args.runs]
    result = {"command": command_line(), "date": str(date.today()), "machine": machine_description(), "rows": rows}
    publish(result, args.out, caption, table)
    return 0 if all(r["same"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
