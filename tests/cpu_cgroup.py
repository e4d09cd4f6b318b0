"""A cgroup with a CPU quota for tests and benchmarks, where this process may create one."""
from __future__ import annotations

import os
import time


def make_cpu_cgroup(name: str, cpus: float):
    """A new cgroup (v1 cpu controller, else v2) limited to `cpus` CPUs: (directory, the argv
    prefix that runs a command inside it); None when no cgroup can be made here."""
    quota = str(int(cpus * 100000))
    for base, writes in (("/sys/fs/cgroup/cpu", {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": quota}),
                         ("/sys/fs/cgroup", {"cpu.max": quota + " 100000"})):
        group = os.path.join(base, "%s-%d" % (name, os.getpid()))
        try:
            os.mkdir(group)
        except OSError:
            continue
        try:
            for file, value in writes.items():
                with open(os.path.join(group, file), "w") as f:
                    f.write(value)
        except OSError:
            os.rmdir(group)
            continue
        return group, ["sh", "-c", 'echo $$ > %s/cgroup.procs && exec "$0" "$@"' % group]
    return None


def remove_cgroup(group: str, wait_s: float = 5.0) -> None:
    """Remove `group` once its processes have exited."""
    end = time.monotonic() + wait_s
    while True:
        try:
            os.rmdir(group)
            return
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.1)
