"""The run directory: the only code that writes into it.

``files`` reads and writes one run directory (:class:`RunStore`, the spec's
``save_partial_result`` among its methods); ``runs`` names, finds, claims and
copies whole run directories of a request.
"""

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
