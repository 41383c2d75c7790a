"""The guard's rule: what becomes of a timed point, decided here alone from the facts it was timed with.

The guard (``guard.py``) gathers the facts: its GPU sampler's looks, its host meter's window over each try, the
host reference's readings against their idle figure and allowance, and the point's idle range over recent calm
sweeps. This module decides, and names every threshold once, beside its reason. docs/guard.md states the rule
with its knobs; tests/test_guard_rule.py drives it row by row.

A GPU is looked at before each of its points and after it:

    seen at a look                                    fate
    NVML cannot look, and require_nvml                the GPU withheld (unguarded)
    another program on it (busy_signs: a process      before any point of it was timed: the GPU withheld (gpu_busy);
    beyond gpu_max_other_processes, not a stray       after one was: the sweep stops, every other device withheld
    context; over gpu_max_utilization before use)     (yielded)

A point is timed in tries; a try that is not clean is timed again once, after DISTURBED_PAUSE_S; the last decides:

    #  over a try                                                                      the try
    1  the guard off, or no host meter                                                 clean, unmetered
    2  its device's cores taken (cpu_contention, gpu_contention): others past the      contended
       room its threads leave plus cpu_max_other_cores; a quota throttling past
       THROTTLING_TOLERATED; so many blocks set aside (threads waiting past
       cpu_max_threads_wait) that too few stood; a GPU point's timing thread
       waiting past gpu_max_host_wait
    3  it read within range_max_slowdown of the top of its own idle range             rows 4-5 not asked
       (inside_own_range)
    4  the reference read the host slowed, by enough times the point's host share     slowed
       to pass the allowance (host_allowance: reference_max_slowdown, or wider)
    5  beside others (range_others_cores, through ranges.others_gate: the gate the     slowed
       service's ranges take calm sweeps by) or the reference read slowed past the
       allowance; HOST_BOUND_SHARE or more of its time the host's; past the top of
       its idle range (a refinement's size: the next configured size's) by more
       than range_max_slowdown
    6  otherwise: past its range with neither is what a real change looks like         clean

    the last try   the point                                              its device
    clean          published; calm (its median joins its idle range)     goes on
                   unless the reference read slowed or could not judge
    slowed         a first visit: timed again as the sweep ends, at       goes on
                   least SLOWED_AGAIN_AFTER_S later, in tries judged
                   as above; slowed again: withheld alone (host_slowed).
                   A revisit: taken back
    contended      not published                                          withheld (cpu_contended), last curve served

Pure: no clock, no I/O.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

from crossover_monitor.analysis.ranges import others_gate
from crossover_monitor.config.settings import GuardSettings
from crossover_monitor.model import DeviceInfo, Withheld, WithheldReason

# A container's quota throttles a thread team that spins now and then; up to this share of a try is let pass.
THROTTLING_TOLERATED = 0.02
DISTURBED_PAUSE_S = 1.0  # a try that is not clean is timed again after this pause (a burst may have passed)
# A point withheld as slowed is timed once more as its sweep ends, at least this long after: a host that slows by
# itself does so in spells longer than the second try's pause (an H100 with 16 vCPUs read its reference 1.1-2.0x
# its idle figure for minutes, issue 54), and one sweep's points are minutes apart at most.
SLOWED_AGAIN_AFTER_S = 20.0
# A host reading may be this many relative IQRs of the idle readings slower before the host counts as slowed
# (about 3 standard deviations of a normal spread).
SPREADS_ALLOWED = 2.0
# ... but never past this: a reference that noisy cannot tell a host that slows the points by half, and the
# allowance it would earn let GPU points 1.5x their idle range pass beside one busy core on a noisy H100
# (allowed 85% after a first sweep whose readings spread by 42%; benchmarks/README.md, "Blocks set aside").
SPREAD_ALLOWANCE_AT_MOST = 0.25
# A sweep without an idle figure judges nothing by the reference before it has this many readings of its own.
READINGS_TO_JUDGE = 8
# A point whose host share is at least this is judged by its own idle range; one mostly the GPU's is left to
# NVML's look (it moving is the GPU's news, which the alerts are for). A quarter: a 4-thread BLAS job moved
# TensorFlow's GPU compute n = 1024, about a third of it dispatch, 1.18x on an H200.
HOST_BOUND_SHARE = 0.25


class Fate(enum.Enum):
    """What the runner does with a verdict."""

    PUBLISHED = "published"
    POINT_WITHHELD = "point withheld alone"
    DEVICE_WITHHELD = "device withheld"
    SWEEP_STOPPED = "sweep stopped"


def fate_of(verdict: Withheld | None, *, job_arrived: bool) -> Fate:
    """The fate of a verdict on a point (None: it stood). ``job_arrived``: a point of its GPU was already timed clean
    in this sweep, so a GPU busy now had a job start on it while the sweep ran."""
    if verdict is None:
        return Fate.PUBLISHED
    if verdict.reason is WithheldReason.HOST_SLOWED:
        return Fate.POINT_WITHHELD
    if verdict.reason is WithheldReason.GPU_BUSY and job_arrived:
        return Fate.SWEEP_STOPPED
    return Fate.DEVICE_WITHHELD


# --- a GPU's look -----------------------------------------------------------------------------------------------


def busy_signs(
    others: Sequence[tuple[int, str]], utilization_pct: float | None, *, before_use: bool, settings: GuardSettings
) -> list[str]:
    """Why a look says another program uses the GPU (empty: nobody). ``others``: the pid and name of each other
    program's process on it, stray contexts left out; ``before_use``: a look before this worker's first point on it,
    the only time utilisation says who."""
    seen = []
    if len(others) > settings.gpu_max_other_processes:
        names = ", ".join(f"pid {pid} {name}" for pid, name in others[:5])
        seen.append(f"{len(others)} other process{'es' if len(others) != 1 else ''} ({names})")
    if before_use and utilization_pct is not None and utilization_pct > settings.gpu_max_utilization_pct:
        seen.append(f"{utilization_pct:g}% utilisation before this worker used it")
    return seen


def is_stray(used_memory_bytes: int | None, sm_utilization_pct: float | None, settings: GuardSettings) -> bool:
    """A stray context (a framework opens one on GPU 0 by default), not a job: no kernel in the last second and no
    more memory than ``gpu_idle_process_max_mib``."""
    idle = sm_utilization_pct is not None and sm_utilization_pct == 0
    small = used_memory_bytes is not None and used_memory_bytes <= settings.gpu_idle_process_max_mib * 2**20
    return idle and small


# --- a try: its device's cores --------------------------------------------------------------------------------


def cpu_room(cores: int, threads: int, settings: GuardSettings) -> float:
    """The cores others may use while a CPU point runs: those its threads leave free, plus ``cpu_max_other_cores``."""
    return max(0, cores - threads) + settings.cpu_max_other_cores


def cpu_contention(
    other_cores: float, throttled_s: float, wall_s: float, *, cores: int, threads: int, settings: GuardSettings
) -> list[str]:
    """Why a CPU point's cores were taken over a try (row 2), less its blocks' stalls (the block watch's say)."""
    found = []
    room = cpu_room(cores, threads, settings)
    if other_cores > room:
        used = f"other processes used {other_cores:.2f} cores of the {cores} this worker may use"
        found.append(f"{used}, where its {threads} threads leave room for {room:.2f}")
    if throttled_s > THROTTLING_TOLERATED * wall_s:
        found.append(f"the container's CPU quota throttled it for {throttled_s * 1000:.0f} ms")
    return found


def gpu_contention(own_wait: float | None, other_cores: float, *, cores: int, settings: GuardSettings) -> list[str]:
    """Why a GPU point's host side was held up over a try (row 2): its timing thread waited for a CPU past
    ``gpu_max_host_wait`` (its time includes the wait). Quota throttling is the CPU's criterion: the container's
    counter covers all of the worker's threads."""
    if own_wait is None or own_wait <= settings.gpu_max_host_wait:
        return []
    others = f"other processes used {other_cores:.2f} cores of the {cores} meanwhile"
    return [f"the thread timing it waited for a CPU {own_wait:.1%} of the time its point ran ({others})"]


# --- a try: the host reference and the point's idle range -----------------------------------------------------


@dataclass(frozen=True)
class IdleRange:
    """The top of an idle range over recent calm sweeps and the point's median against it."""

    median_s: float
    top_s: float
    sweeps: int
    stand_in_size: int | None = None  # the configured size whose range stands in (a refinement's); None: its own


@dataclass(frozen=True)
class TryFacts:
    """What the guard saw over one try of a point, for rows 3-6."""

    others: float  # other programs' cores (or the hypervisor's steal) over the try
    usual_others: float  # what others use of the host in nine sweeps of ten (0: not known)
    cores: int
    host_slowdown: float | None  # the host reference's reading over its figure (None: not read)
    reference_s: float | None  # that figure
    allowance: float | None  # how far the host may read slowed (None: too few readings say yet)
    host_share: float  # the share of the point's time that is the host's, for the reference (row 4)
    own: IdleRange | None  # its own idle range
    judged: IdleRange | None  # the range it is held against beside others: its own, or the next size's
    share_at_top: float | None  # its host share at that range's top


def judge_try(facts: TryFacts, settings: GuardSettings) -> str | None:
    """Why the try was slowed (rows 4-5), or None."""
    if inside_own_range(facts.own, settings.range_max_slowdown):
        return None
    return _reference_moved(facts) or _past_own_range(facts, settings)


def inside_own_range(own: IdleRange | None, tolerance: float) -> bool:
    """Row 3: the point read within ``tolerance`` (``range_max_slowdown``) of the top of its own idle range. The
    reference predicts how far a slowed host moved the point; this point, timed, did not move past its calm sweeps
    (on an idle H100, 2 of 7 sweeps withheld points alone by reference readings of 1.47-1.72x). A refinement's size,
    held against the next configured size's range, is not let through by that range: it lies above the size's own."""
    return own is not None and own.median_s / own.top_s - 1.0 <= tolerance


def reference_read_slowed(facts: TryFacts) -> bool:
    """The reference read the host slower than its figure by more than the allowance, whatever the point's share."""
    slowdown, allowed = facts.host_slowdown, facts.allowance
    return slowdown is not None and allowed is not None and slowdown - 1.0 > allowed


def calm_others(facts: TryFacts, others_over_tries: float) -> float | None:
    """What the point says others used (over every try: one that stood once others left was still timed beside them
    first), or None where it must not count as calm: the reference read the host slowed past the allowance over its
    last try, or read it but could not judge yet (a first sweep on a slowed host is not calm)."""
    unjudged = facts.host_slowdown is not None and facts.allowance is None
    return None if reference_read_slowed(facts) or unjudged else others_over_tries


def _reference_moved(facts: TryFacts) -> str | None:
    """Row 4: the slowdown times the host share passes the allowance."""
    allowed, slowdown, figure = facts.allowance, facts.host_slowdown, facts.reference_s
    if slowdown is None or figure is None or allowed is None:
        return None
    share = facts.host_share
    moved = (slowdown - 1.0) * min(max(share, 0.0), 1.0)
    if moved <= allowed:
        return None
    own = facts.own
    against = (
        ""
        if own is None
        else (
            f"; it read {own.median_s * 1e3:.3g} ms, {own.median_s / own.top_s:.2f}x the top of its idle range over "
            f"{own.sweeps} calm sweeps"
        )
    )
    return (
        f"the host ran {slowdown:.2f}x slower than its idle reference while it was timed "
        f"({slowdown * figure * 1e3:.3g} ms against {figure * 1e3:.3g} ms), which moves a point "
        f"{share:.0%} of whose time is the host's by about {moved:.0%} (allowed {allowed:.0%}){against}"
    )


def _past_own_range(facts: TryFacts, settings: GuardSettings) -> str | None:
    """Row 5. Only a host-bound point: the reference reads the timing thread, but a neighbour's BLAS thread beside one
    of a framework's pool threads, or its memory traffic beside a copy, slows the point and leaves the reference
    almost as fast (TensorFlow beside a 1-thread BLAS job on an H200: points 1.25-1.35x their idle range while the
    reference read 1.07x); and a host that slowed by itself moved points further than the reference's reading times
    their host share says (an idle H100: GPU compute n = 512 at 1.5x its other sweeps' while the reference passed)."""
    found = facts.judged
    gate = others_gate(facts.usual_others, settings.range_others_cores)
    beside_others = facts.others >= gate
    if found is None or (not beside_others and not reference_read_slowed(facts)):
        return None
    share = facts.share_at_top
    ratio = past_idle_range(found.median_s, found.top_s, share, settings.range_max_slowdown)
    if ratio is None or share is None:
        return None
    whose = "its idle range" if found.stand_in_size is None else f"the idle range of n = {found.stand_in_size}"
    if beside_others:
        # Moved past the setting by the node's usual load: name it, as the gate is not the configured one.
        usual = f" (usually {facts.usual_others:.2f})" if gate > settings.range_others_cores else ""
        beside = f"others used {facts.others:.2f} cores of the {facts.cores}{usual}"
    else:
        beside = f"the host reference read the host {facts.host_slowdown or 1.0:.2f}x slower than its idle figure"
    return (
        f"it ran {ratio:.2f}x the top of {whose} over {found.sweeps} calm sweeps ({found.median_s * 1e3:.3g} ms "
        f"against {found.top_s * 1e3:.3g} ms, allowed {settings.range_max_slowdown:.0%}) while {beside}, and "
        f"{share:.0%} of its time is the host's"
    )


def past_idle_range(median_s: float, top_s: float, share_at_top: float | None, allowed: float) -> float | None:
    """How many times the top of its idle range a point read (``median_s / top_s``) where that is past it by more
    than ``allowed`` (``range_max_slowdown``) and the point is host-bound at the top (``HOST_BOUND_SHARE``); None
    otherwise, or where the top is not a time. Row 5's test, which benchmarks replay over recorded sweeps."""
    if not (math.isfinite(top_s) and top_s > 0) or share_at_top is None or share_at_top < HOST_BOUND_SHARE:
        return None
    ratio = median_s / top_s
    return ratio if ratio - 1.0 > allowed else None


def host_allowance(reference_max_slowdown: float, spread: float) -> float:
    """How far the host may run slower than its figure before a point counts as moved: ``reference_max_slowdown``, or
    ``SPREADS_ALLOWED`` times the reference's relative spread where that is wider, up to
    ``SPREAD_ALLOWANCE_AT_MOST``."""
    return max(reference_max_slowdown, min(SPREADS_ALLOWED * spread, SPREAD_ALLOWANCE_AT_MOST))


def point_verdict(device: DeviceInfo, contended: Sequence[str], slowed: str | None) -> Withheld | None:
    """The last try's verdict on the point: contended withholds its device (with the slowdown, if any, named too);
    slowed withholds it alone; else it stands."""
    if contended:
        reason, detail = (
            WithheldReason.CPU_CONTENDED,
            "; ".join([*contended] if slowed is None else [*contended, slowed]),
        )
    elif slowed is not None:
        reason, detail = WithheldReason.HOST_SLOWED, slowed
    else:
        return None
    return Withheld(backend=device.backend, device=device.device, reason=reason, detail=detail + " (timed twice)")
