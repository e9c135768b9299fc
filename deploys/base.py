# Base of every servefleet node; included by every recipe. Run on its own:
#   pyinfra inventory/testbed.py deploys/base.py
from servefleet import base

base.validate_data()  # bad data stops the whole run here, before any host is changed
base.preflight()  # arch, GPU + driver (unless require_gpu = False), free disk: fails only this host
base.os_packages()  # apt packages of this distro family, from data
base.service_user_and_tree()  # the servefleet system user and /opt/servefleet/{tools,venvs,...}
base.tools()  # a small venv with uv, which makes the serving venvs
