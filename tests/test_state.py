"""The served state's store: what a retry of withheld GPUs counts as."""

from __future__ import annotations

import dataclasses

from monitor.model import RetryResult, Withheld, WithheldReason
from monitor.state import StateStore
from tests.guardfakes import IDLE, sweep_with


def test_a_gpu_withheld_for_a_busy_host_is_retried_and_a_retry_that_finds_it_so_again_counts_busy() -> None:
    """Every core taken passes like a job does: the GPU is tried again; the CPU alone is not (it has no retries)."""
    _, outcome = sweep_with(lambda _: IDLE)
    snapshot = outcome.snapshot
    assert snapshot is not None
    contended = [
        Withheld(backend="fake", device=d, reason=WithheldReason.CPU_CONTENDED, detail="every core taken")
        for d in ("/GPU:0", "/CPU:0")
    ]
    assert dataclasses.replace(snapshot, withheld=tuple(contended)).gpus_to_retry == ("/GPU:0",)
    assert dataclasses.replace(snapshot, withheld=(contended[1],)).gpus_to_retry == ()
    store = StateStore()
    store.record(outcome)
    retry = dataclasses.replace(outcome, snapshot=dataclasses.replace(snapshot, withheld=(contended[0],)))
    assert store.record_retry(retry) is RetryResult.BUSY
