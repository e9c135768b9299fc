"""The benchmarks' measure of one command (servefleet_dev.testing.procstat): CPU of the child and
of what it waited for, its own peak memory, its peak open descriptors by kind, and a lowered
open-files limit that makes an excess fail outright."""

import sys
import textwrap

from servefleet_dev.testing.procstat import fd_kind, run_measured, slope


def py(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def test_cpu_memory_and_descriptors_of_one_child():
    m = run_measured(
        py(
            """
            import os, time
            block = bytearray(64 * 1024 * 1024)  # 64 MiB, touched
            for i in range(0, len(block), 4096):
                block[i] = 1
            pipes = [os.pipe() for _ in range(40)]
            t = time.process_time()
            while time.process_time() - t < 0.3:
                pass
            time.sleep(0.3)  # held open while sampled
            print("done")
            """
        )
    )
    assert m.returncode == 0, m.stderr
    assert m.stdout.strip() == "done"
    assert m.cpu_s >= 0.3
    assert m.maxrss_kib >= 64 * 1024
    assert m.peak_fds >= 80
    assert m.fd_kinds["pipe"] >= 80


def test_cpu_of_a_grandchild_it_waited_for_is_counted():
    m = run_measured(
        py(
            """
            import subprocess, sys
            subprocess.run([sys.executable, "-c",
                "import time\\nt = time.process_time()\\n"
                "while time.process_time() - t < 0.4: pass"], check=True)
            """
        )
    )
    assert m.returncode == 0, m.stderr
    assert m.cpu_s >= 0.4


def test_tree_counts_what_the_children_hold():
    m = run_measured(
        py(
            """
            import subprocess, sys
            subprocess.run([sys.executable, "-c",
                "import os, time\\np = [os.pipe() for _ in range(30)]\\ntime.sleep(0.5)"],
                check=True)
            """
        ),
        tree=True,
    )
    assert m.returncode == 0, m.stderr
    assert m.peak_tree_fds >= 60
    assert m.peak_fds < 30  # the parent itself held few


def test_a_lowered_open_files_limit_fails_an_excess():
    code = "import os\np = [os.pipe() for _ in range(100)]\n"
    assert run_measured(py(code)).returncode == 0
    limited = run_measured(py(code), nofile=64)
    assert limited.returncode != 0
    assert "Too many open files" in limited.stderr


def test_a_command_past_its_timeout_is_killed():
    m = run_measured(py("import time\ntime.sleep(30)"), timeout=0.5)
    assert m.returncode == -9
    assert m.wall_s < 10


def test_fd_kinds_and_slope():
    assert fd_kind("socket:[123]") == "socket"
    assert fd_kind("pipe:[9]") == "pipe"
    assert fd_kind("anon_inode:[eventpoll]") == "eventpoll"
    assert fd_kind("/dev/null") == "/dev"
    assert fd_kind("/root/x.log") == "file"
    assert slope((10, 2.0), (50, 6.0)) == 0.1
