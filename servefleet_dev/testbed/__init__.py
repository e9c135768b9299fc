"""The local testbed: real Debian 12 hosts as systemd-nspawn containers on a private bridge.

Used by the tests, the README's first command and the benchmarks as a stand-in for a fleet.
"""
