"""The run directory: the only code that writes into it.

``files`` reads and writes one run directory (:class:`RunStore`, the spec's
``save_partial_result`` among its methods), ``details`` its per-task records
(the one module that knows where they lie); ``runs`` names, finds, claims and
copies whole run directories of a request.

Names load on first use: naming a run at configuration (:func:`new_run_id`)
must not import the store's writers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ... import _load_export

if TYPE_CHECKING:
    from .files import PLANS_KEY, RUN_INFO, RunStore, read_json, read_run_info_head
    from .runs import (
        claim_run_dir,
        copy_details,
        find_carry_over_source,
        find_resumable_run,
        iter_runs,
        killed_runs,
        new_run_id,
        now,
        record_killed,
        release_run_dir,
    )

_EXPORTS = {
    "PLANS_KEY": ".files",
    "RUN_INFO": ".files",
    "RunStore": ".files",
    "read_json": ".files",
    "read_run_info_head": ".files",
    "claim_run_dir": ".runs",
    "copy_details": ".runs",
    "find_carry_over_source": ".runs",
    "find_resumable_run": ".runs",
    "iter_runs": ".runs",
    "killed_runs": ".runs",
    "new_run_id": ".run_ids",
    "now": ".run_ids",
    "record_killed": ".runs",
    "release_run_dir": ".runs",
}

__all__ = [
    "PLANS_KEY",
    "RUN_INFO",
    "RunStore",
    "claim_run_dir",
    "copy_details",
    "find_resumable_run",
    "find_carry_over_source",
    "iter_runs",
    "killed_runs",
    "new_run_id",
    "now",
    "read_json",
    "read_run_info_head",
    "record_killed",
    "release_run_dir",
]


def __getattr__(name: str) -> Any:
    return _load_export(__name__, _EXPORTS, name)
