"""``[degradation]``: slow GPUs (stragglers) and degraded links, judged against peers (issue 29, docs/degradation.md).

Off by default: a peer comparison is a heuristic, and a fleet should see what it would find (``replay``,
``--dry-run``, the ``gpuremediate_degradation_gpus`` gauge) before it cordons anything for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuremediate.vocab.findings import ACTION_CORDON, ACTION_DRAIN, ACTION_NONE
from gpuremediate.vocab.schema import MAX_DURATION_S, PolicyError, at_least, between, excerpt, one_of, setting
from gpuremediate.vocab.window import Window, WindowError

DEGRADATION_ACTIONS = (ACTION_CORDON, ACTION_DRAIN, ACTION_NONE)
TREND_MAINTENANCE = "maintenance"  # a trend files a MaintenanceRequest for the next trend window
TREND_ACTIONS = (ACTION_NONE, ACTION_CORDON, TREND_MAINTENANCE)
TREND_RECOMMENDED = ("COMPONENT_RESET", "RESTART_BM", "NONE")  # the request's recommendedAction


MAX_WINDOW_TEXT = 200  # longer than any list of weekdays, HH:MM range or IANA zone name


@dataclass(frozen=True)
class DegradationPolicy:
    enabled: bool = setting(False, "find slow GPUs and degraded links (peer comparison; off until a fleet has "
                            "seen what it would find: docs/degradation.md)")
    slow_action: str = setting(ACTION_CORDON, "slow-gpu: cordon (stop new work, the job finishes) | drain (drain, "
                               "then validate) | none (an Event only)", check=one_of(*DEGRADATION_ACTIONS))
    link_action: str = setting(ACTION_CORDON, "link-degraded: cordon | drain | none",
                               check=one_of(*DEGRADATION_ACTIONS))
    slow_ratio: float = setting(0.85, "a busy GPU whose SM clock is below this share of its peers' median is an "
                                "outlier", check=between(0.1, 0.99))
    mad_k: float = setting(3.0, "and below the median by more than this many robust deviations (1.4826 x MAD)",
                           check=between(0, 100))
    min_peers: int = setting(4, "busy peers (same model, node group, job) needed to judge a GPU", check=at_least(2))
    min_node_peers: int = setting(2, "busy GPUs of the same job on the same node beside it; with fewer the GPU is "
                                  "not judged (a node or rack running slow together is not a GPU's fault)",
                                  check=at_least(1))
    busy_util_pct: float = setting(50.0, "DCGM_FI_DEV_GPU_UTIL (%) at or above which a GPU is busy; idle GPUs "
                                   "are never slow", check=between(0, 100))
    busy_activity: float = setting(0.3, "or DCGM_FI_PROF_GR_ENGINE_ACTIVE / SM_ACTIVE (0-1) at or above this",
                                   check=between(0, 1))
    hold_s: float = setting(300.0, "seconds an outlier before the slow-gpu finding", check=between(0, MAX_DURATION_S))
    clear_hold_s: float = setting(600.0, "seconds not an outlier (or idle) before the finding clears",
                                  check=between(0, MAX_DURATION_S))
    peer_label: str = setting("", "a node label splitting peers further (a rack or power domain), \"\" for none")
    pcie_replays_min: int = setting(20, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER increase within one episode that makes it "
                                    "link-degraded (0 disables)", check=at_least(0))
    nvlink_errors_min: int = setting(20, "NVLink CRC/replay/recovery error increase within one episode "
                                     "(0 disables)", check=at_least(0))
    link_hold_s: float = setting(180.0, "seconds a counter keeps rising before link-degraded",
                                 check=between(0, MAX_DURATION_S))
    link_gap_s: float = setting(300.0, "a counter quiet this long ends its episode (sporadic errors never add up)",
                                check=between(1, MAX_DURATION_S))
    link_clear_s: float = setting(1800.0, "seconds without a new error before link-degraded clears",
                                  check=between(0, MAX_DURATION_S))

    trends: bool = setting(False, "find failing trends: single-bit ECC errors, new remapped rows, pages pending "
                           "retirement (independent of enabled)")
    trend_action: str = setting(ACTION_NONE, "a trend: none (an Event and `explain`: plan its maintenance) | "
                                "cordon (stop new work; never a drain) | maintenance (file a MaintenanceRequest "
                                "whose drain starts at the next trend window; never an immediate drain)",
                                check=one_of(*TREND_ACTIONS))
    trend_window_days: str = setting("Sat,Sun", "trend maintenance: the window's weekdays (Mon-Fri, Sat,Sun, ...)")
    trend_window_hours: str = setting("02:00-06:00", "trend maintenance: the window's hours, HH:MM-HH:MM (may "
                                      "cross midnight); the drain starts when it opens")
    trend_window_zone: str = setting("UTC", "trend maintenance: the window's time zone (an IANA name)")
    trend_recommended: str = setting("COMPONENT_RESET", "trend maintenance: the request's recommendedAction: "
                                     "COMPONENT_RESET (drain, reset the GPU, validate) | RESTART_BM (reboot) | "
                                     "NONE (drained and held for a person)", check=one_of(*TREND_RECOMMENDED))
    sbe_min: int = setting(100, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL increase within sbe_window_s (0 disables)",
                           check=at_least(0))
    sbe_window_s: float = setting(3600.0, "the single-bit ECC window", check=between(60, MAX_DURATION_S))
    rows_new_min: int = setting(2, "new DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS within rows_window_s (0 disables)",
                                check=at_least(0))
    rows_window_s: float = setting(86400.0, "the remapped-rows window", check=between(60, MAX_DURATION_S))

    def validate(self, path: str) -> None:
        if self.link_gap_s > self.link_clear_s:
            raise PolicyError(f"{path}: link_gap_s ({self.link_gap_s:g}) must not exceed link_clear_s "
                              f"({self.link_clear_s:g})")
        for name in ("trend_window_days", "trend_window_hours", "trend_window_zone"):
            value = getattr(self, name)
            if len(value) > MAX_WINDOW_TEXT:  # the window's own errors quote the whole value
                raise PolicyError(f"{path}.{name}: {excerpt(value)} is too long for a window setting")
        try:
            self.trend_window()
        except WindowError as exc:
            flag = str(exc).partition(":")[0].strip("- ")
            setting_name = {"days": "trend_window_days", "hours": "trend_window_hours",
                            "timezone": "trend_window_zone"}.get(flag, "trend_window")
            raise PolicyError(f"{path}.{setting_name}: {str(exc).partition(':')[2].strip()}") from None

    def trend_window(self) -> Window:
        """The weekly window a trend's maintenance drain starts in (``trend_action = "maintenance"``)."""
        return Window.parse(self.trend_window_days, self.trend_window_hours, self.trend_window_zone)
