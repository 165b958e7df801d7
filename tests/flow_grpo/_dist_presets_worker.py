"""Launched by test_distributed_presets.py: ``python -m torch.distributed.run --nproc_per_node 2
_dist_presets_worker.py OUT`` (CPU, gloo, OMP_NUM_THREADS=1). Trains every flow preset of conftest.PRESET_CASES for
conftest.PRESET_EPOCHS epochs in one launch (imports are the expensive part) and writes each process's per-epoch
metrics to OUT/presets_r{rank}.json. A preset that raises is recorded as an error and the next one runs; a gloo
abort (the issue-31 crash: collectives of different shapes) ends the launch, which the test reports."""
import importlib.util
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

torch.set_num_threads(1)
HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("flow_conftest", HERE / "conftest.py")
conf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(conf)


def main() -> None:
    out = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    names = sys.argv[2].split(",") if len(sys.argv) > 2 else [c[0] for c in conf.PRESET_CASES]
    results = {}
    for name in names:
        t0 = time.perf_counter()
        try:
            hist = conf.run_preset_case(name, out / name)
            results[name] = {"history": hist}
        except Exception as exc:  # recorded; the test shows it (both processes raise alike: collectives agree)
            results[name] = {"error": "".join(traceback.format_exception(exc))[-3000:]}
        results[name]["seconds"] = time.perf_counter() - t0
        print(f"rank {rank}: {name} {results[name]['seconds']:.1f}s {'error' if 'error' in results[name] else 'ok'}",
              flush=True)
        (out / f"presets_r{rank}.json").write_text(json.dumps(results, default=float))
    results["_gather_check"] = gather_check(rank)
    (out / f"presets_r{rank}.json").write_text(json.dumps(results, default=float))


def gather_check(rank: int) -> dict:
    """gather_groups with tensors that differ in more than dim 0: a ValueError on both processes (gloo would abort
    the process), after which the process group still works."""
    from mmgrpo.engine.dist import gather_groups

    out = {}
    try:
        gather_groups([torch.zeros(2 + rank, 3 + rank), torch.zeros(2 + rank)])
        out["error"] = None
    except ValueError as exc:
        out["error"] = str(exc)
    (rows,), sl = gather_groups([torch.full((1 + rank, 2), float(rank))])
    out["after"] = rows.tolist()
    out["slice"] = [sl.start, sl.stop]
    return out


if __name__ == "__main__":
    main()
