"""A fleet session may hold one connection per host for its whole run: servefleet raises its
soft open-files limit (within the hard one) to what the number of hosts needs, so a shell's
default 1024 does not fail hosts past ~1,000 as unreachable (servefleet.verbs.session)."""

import subprocess
import sys
import textwrap

PROBE = textwrap.dedent(
    """
    import resource, sys
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    from servefleet.verbs.session import FDS_FIXED, FDS_PER_HOST, allow_open_files
    small = allow_open_files(10)  # 10 hosts fit in 256: left as it is
    big = allow_open_files(5000)
    print(small, big, hard, FDS_FIXED + FDS_PER_HOST * 5000)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 300))
    print(allow_open_files(5000))  # never above the hard limit
    """
)


def test_the_soft_limit_is_raised_to_what_the_hosts_need_within_the_hard_one():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    first, second = done.stdout.splitlines()
    small, big, hard, want = map(int, first.split())
    assert small == 256
    assert big == min(want, hard)
    assert int(second) == 300
