"""Debian packages a test needs (PostgreSQL, tmux), installed by the test set-up where missing."""

from __future__ import annotations

import os
import shutil
import subprocess


def apt_install(package: str) -> bool:
    """Install Debian's ``package`` with apt-get; False where this host cannot (not root, no apt)."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return False
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=False, env=env, capture_output=True, timeout=300)
    done = subprocess.run(["apt-get", "install", "-y", "-qq", package], check=False, env=env, capture_output=True,
                          timeout=600)
    return done.returncode == 0
