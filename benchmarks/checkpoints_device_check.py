"""Every training checkpoint of tests/data/checkpoints-v2 (each registered variant's, and those
written before the layer held its attention step) on another machine: loaded with that machine's
torch, scored on its CPU (the stored score: a count of right answers, compared for equality), and,
where CUDA is present, its model moved to the GPU and the logits of four test examples compared
with the CPU's (float32). One line per run, then the largest difference.

    PYTHONPATH=src python benchmarks/checkpoints_device_check.py [OUT.json]
"""

import json
import sys
from pathlib import Path

import torch

from attnlab import objectives, tasks
from attnlab.training import evaluate, load_checkpoint

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "checkpoints-v2"


def _to(x, device):
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, dict):
        return {k: _to(v, device) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_to(v, device) for v in x)
    return x


def check(written: str, case: str, expected: dict) -> dict:
    folder = DATA / written / case
    value = evaluate(folder).value
    out = {"run": f"{written}/{case}", "score": value, "stored": expected["value"], "same_score": value == expected["value"]}
    if not torch.cuda.is_available():
        return out
    ck = load_checkpoint(folder)
    task = tasks.create(ck.config.task, **ck.config.task_options)
    inputs, _ = objectives.collate(task, task.split("test"), torch.arange(4))
    model = ck.model.eval()
    with torch.no_grad():
        torch.manual_seed(0)
        cpu = model(**inputs).output
        model.to("cuda")
        torch.manual_seed(0)
        torch.cuda.manual_seed(0)
        gpu = model(**_to(inputs, "cuda")).output.cpu()
    out["cuda_max_abs_diff"] = float((cpu - gpu).abs().max())
    return out


def main() -> None:
    rows = []
    for written in ("before-step", "with-step"):
        expected = json.loads((DATA / written / "expected.json").read_text())["runs"]
        for case in expected:
            try:
                rows.append(check(written, case, expected[case]))
            except Exception as e:  # one line per failure, the rest still checked
                rows.append({"run": f"{written}/{case}", "error": f"{type(e).__name__}: {e}"})
            print(json.dumps(rows[-1]), flush=True)
    diffs = [r["cuda_max_abs_diff"] for r in rows if "cuda_max_abs_diff" in r]
    summary = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
               "runs": len(rows), "same_score": sum(bool(r.get("same_score")) for r in rows),
               "errors": sum("error" in r for r in rows), "largest_cuda_diff": max(diffs) if diffs else None}
    print(json.dumps(summary))
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps({"summary": summary, "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
