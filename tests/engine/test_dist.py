"""mmgrpo.engine.dist: identities without a process group, and real sums / maxima / gathers over two gloo
processes (values checked against what each rank contributed, computed by hand)."""
import json
import sys

import pytest
import torch
import torch.multiprocessing as mp

from mmgrpo.engine import dist as D


def test_identities_without_a_process_group():
    assert D.process_group() is None and D.world_info() == (0, 1)
    assert D.global_sum(torch.tensor(3)) == 3.0 and isinstance(D.global_sum(2), float)
    assert D.global_max(-1.5) == -1.5
    assert D.all_reduce([1, 2.5], "max") == [1.0, 2.5]
    assert D.all_gather_object({"a": 1}) == [{"a": 1}]
    assert D.broadcast_object("x") == "x"
    assert D.any_process(True) is True and D.any_process(0) is False
    D.barrier()
    outs, sl = D.gather_rows([torch.arange(3)], "cpu")
    assert outs[0].tolist() == [0, 1, 2] and sl == slice(0, 3)
    with pytest.raises(ValueError, match="op must be"):
        D.all_reduce([1.0], "mean")


def _worker(rank: int, init: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        res = {
            "sum": D.global_sum(torch.tensor(rank + 1.5)),  # 1.5 + 2.5
            "max": D.global_max(10.0 - 3 * rank),  # max(10, 7)
            "vec": D.all_reduce([rank, 1.0, -rank], "sum"),
            "vmax": D.all_reduce([rank, -rank], "max", "cpu"),
            "objs": D.all_gather_object({"r": rank}),
            "bcast": D.broadcast_object(f"from {rank}"),
            "world": list(D.world_info()),
            "any": [D.any_process(rank == 1), D.any_process(False), D.any_process(True)],
        }
        rows, sl = D.gather_rows([torch.arange(rank + 1) + 10 * rank], "cpu")  # ragged: 1 row, then 2 rows
        res["rows"], res["slice"] = rows[0].tolist(), [sl.start, sl.stop]
        # rank 1's rows declared a copy of rank 0's (a sequence-parallel group): counted and gathered once
        D.set_row_source(0)
        try:
            rows, sl = D.gather_rows([torch.arange(2) + 10 * rank], "cpu")
            res["sp"] = {"sum": D.global_sum(rank + 1.5), "max": D.global_max(10.0 + 3 * rank),
                         "rows": rows[0].tolist(), "slice": [sl.start, sl.stop], "src": D.row_source()}
        finally:
            D.set_row_source(None)
        D.barrier()
        with open(f"{out}.{rank}", "w") as f:
            json.dump(res, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
@pytest.mark.skipif(sys.platform != "linux", reason="gloo over a file store")
def test_two_gloo_processes(tmp_path):
    mp.spawn(_worker, args=(f"file://{tmp_path / 'store'}", str(tmp_path / "res")), nprocs=2, join=True)
    r = [json.loads((tmp_path / f"res.{k}").read_text()) for k in (0, 1)]
    for k, res in enumerate(r):
        assert res["sum"] == 4.0 and res["max"] == 10.0
        assert res["vec"] == [1.0, 2.0, -1.0] and res["vmax"] == [1.0, 0.0]
        assert res["objs"] == [{"r": 0}, {"r": 1}] and res["bcast"] == "from 0"
        assert res["world"] == [k, 2] and res["any"] == [True, False, True]
        assert res["rows"] == [0, 10, 11]
    assert r[0]["slice"] == [0, 1] and r[1]["slice"] == [1, 3]
    for res in r:  # rank 0's sum and rows only; the max still over both; both get rank 0's slice
        assert res["sp"] == {"sum": 1.5, "max": 13.0, "rows": [0, 1], "slice": [0, 2], "src": 0}
