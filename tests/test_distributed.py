"""DDP and FSDP2 around remat-ir, two gloo ranks on CPU (tests/distributed_runs.py).

One spawn runs every case (process start and imports dominate); each test reads
its case's numbers: gradients of every step equal to eager's over the global
batch within 1e-6 relative, the same schedule on both ranks (planned once, on
rank 0), and one clear error on every rank when their input shapes differ.
"""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="no torch.distributed")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    import torch.multiprocessing as mp

    import distributed_runs

    out = tmp_path_factory.mktemp("distributed") / "results.json"
    mp.spawn(distributed_runs.run_all, args=(2, distributed_runs.free_port(), str(out)), nprocs=2)
    return json.loads(out.read_text())


@pytest.mark.parametrize("case", ["gpt2-ddp", "cnn-ddp", "gpt2-fsdp", "cnn-fsdp"])
def test_gradients_equal_one_process_over_the_global_batch(runs, case):
    for rank, results in enumerate(runs):
        result = results[case]
        assert "failure" not in result, f"rank {rank}: {result.get('failure')}"
        assert result["worst_relative_error"] <= 1e-6, (rank, result)
        assert result["same_schedule_on_all_ranks"], rank
        assert result["groups"] > 1, "under torch.distributed gradients leave in several groups"
        # Some gradients, not all, were handed to DDP (or reduce-scattered by FSDP) while
        # the backward segment still had a group to run: the reduction can overlap it.
        assert all(0 < n < result["parameters"] for n in result["reduced_before_last_group"]), result


def test_ranks_with_different_shapes_get_one_clear_error(runs):
    messages = [results["mismatch"] for results in runs]
    for message in messages:
        assert message["type"] == "RankMismatch", messages
        assert "rank 1's inputs differ from rank 0's" in message["error"]
        assert "input_ids" in message["error"] and "same shapes" in message["error"]
