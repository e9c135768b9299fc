# The base of every servefleet node; every recipe starts with it. Run on its own:
#   pyinfra inventory/testbed.py deploys/base.py
from servefleet.recipes import base

if base.begin("base"):  # data checked (bad data stops the whole run before any change)
    base.preflight()  # arch, GPU + driver (unless require_gpu = False), free disk: fails only this host
    base.os_packages()  # apt packages of this distro family, from data
    base.account_and_tree()  # the servefleet account; root-owned tree, the service's cache and models
    base.tools(base.TOOLS)  # a small root-owned venv with uv, which makes the serving venvs
