"""`normal_priority`: the node agent's thread under Ray (nice 15) runs at nice 0 where it may, and what it
starts afterwards inherits that."""

from __future__ import annotations

import os
import subprocess
import threading

from agents.process import normal_priority


def _in_thread(fn):
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


def test_a_reniced_thread_comes_back_to_0_and_its_children_inherit_it():
    def reniced_then_normal() -> tuple[int, int, int]:
        os.setpriority(os.PRIO_PROCESS, 0, 15)  # as Ray starts its workers (raising it needs no privilege)
        before = os.getpriority(os.PRIO_PROCESS, 0)
        after = normal_priority()
        child = int(subprocess.run(["sh", "-c", "nice"], capture_output=True, text=True, check=True).stdout)
        return before, after, child

    mine = os.getpriority(os.PRIO_PROCESS, 0)
    before, after, child = _in_thread(reniced_then_normal)
    assert before == 15
    if os.geteuid() == 0:
        assert after == 0 and child == 0
    else:  # not allowed to lower it: unchanged, and said so by the return value
        assert after == 15 and child == 15
    assert os.getpriority(os.PRIO_PROCESS, 0) == mine  # per thread: the test's own thread is untouched
