"""Tray tests run on Qt's offscreen platform (no display needed); set before Qt loads."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
