"""Text from other users and computers, shown by Qt as the text it is.

Names (owner, project, session, purpose, job, computer, GPU), reasons and messages come from
other people, a coordinator or a broker of another version. Qt reads a label's text, a tool
tip and a table cell's tool tip as HTML whenever `Qt::mightBeRichText` says it looks like
HTML, and a menu entry's `&` as a shortcut: a name `<img src=x width=20000 height=20000>` once
grew a tray to several GiB and froze it, `<a>`/`<b>` showed as a link and in bold, `&File`
underlined the F. Control characters (terminal escapes) and bidi overrides (U+202E turns the
rest of a line around) never reach the screen either.

- `clean(text)` → the text without control, format (bidi, zero-width), surrogate,
  private-use or unassigned characters: line breaks and tabs become spaces, the others go.
  The categories are those `rbroker_protocol.descriptions` refuses in declared descriptions;
  here they are dropped on display, since not every string the tray shows went through that
  check (GPU and computer names, reasons, messages, a broker or coordinator of another
  version).
- `PlainLabel`: a `QLabel` whose text format is `Qt.PlainText` and whose `setText` cleans.
- `tool_tip(text)` → a widget's or a cell's tool tip: `text` as it is when Qt would read it as
  plain text, else escaped and wrapped in `<p style='white-space:pre'>…</p>` (rich text made of
  nothing but literal characters; line breaks kept). Tool tips have no text-format setter.
- `tray_tip(text)` → the tray icon's tool tip, which is native plain text on Windows, macOS
  and desktop-bus trays but Qt's own (rich-text-detecting) tool tip on an X11 tray: after each
  `<` and `&` a word joiner (U+2060, invisible) so `Qt::mightBeRichText` finds no tag.
- `menu_text(text)` → a menu entry's text with each `&` doubled.
- `notification_body(text, markup)` → a desktop notification's body: escaped (`&lt;`) for a
  freedesktop notification server that reads markup in bodies (it advertises `body-markup`:
  GNOME Shell, KDE Plasma, dunst, xfce4-notifyd, mako; `<b>`, `<a href>` and `<img src>`
  would render), else with `tray_tip`'s word joiners (a server without markup shows them as
  nothing; Qt's own balloon, used when there is no server, detects rich text like a tool
  tip). The summary (title) is plain text to every server: `clean`ed only.

Each line of a multi-line text is cleaned on its own: line breaks the tray writes itself stay.
"""

from __future__ import annotations

import html
import unicodedata
from typing import Final

from PySide6.QtCore import Qt
from PySide6.QtGui import Qt as GuiQt
from PySide6.QtWidgets import QLabel, QWidget

_DROPPED: Final = frozenset({"Cc", "Cf", "Cs", "Co", "Cn"})
"""Controls (ESC, NUL…), format (bidi controls, zero-width), surrogate, private-use and
unassigned characters."""

_SPACED: Final = frozenset("\t\n\v\f\r\x1c\x1d\x1e\x85\u2028\u2029")
"""White-space controls and line and paragraph separators (what `str.splitlines` splits at,
and tab): a space each."""

WORD_JOINER: Final = "\u2060"


def _shown(ch: str) -> str:
    if ch in _SPACED:
        return " "
    return "" if unicodedata.category(ch) in _DROPPED else ch


def clean(text: object) -> str:
    """`"\\x1b[31mred\\u202e"` → `"[31mred"`: `text` (any value, as `str()` writes it) on
    one line: line breaks and tabs as spaces, other controls and format characters dropped."""
    s = str(text)
    if s.isprintable():
        return s  # the usual case: nothing to change
    return "".join(_shown(ch) for ch in s)


def clean_lines(text: object) -> str:
    """`clean` on each line of `text`: the line breaks stay, nothing else does."""
    return "\n".join(clean(line) for line in str(text).split("\n"))


class PlainLabel(QLabel):
    """A label whose text is always plain (`Qt.PlainText`) and `clean`ed line by line: for
    every label that may show a name or message from someone else."""

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setText(text)

    def setText(self, text: str) -> None:
        super().setText(clean_lines(text))


def tool_tip(text: object) -> str:
    """`"GPU <b>0</b>"` → `"<p style='white-space:pre'>GPU &lt;b&gt;0&lt;/b&gt;</p>"`,
    `"GPU 0"` → `"GPU 0"`: a tool tip Qt shows as the text it is (see the module's doc)."""
    s = clean_lines(text)
    if not GuiQt.mightBeRichText(s):
        return s
    return f"<p style='white-space:pre'>{html.escape(s, quote=False)}</p>"


def tray_tip(text: object) -> str:
    """`"a <b>"` → `"a <\\u2060b>"`: the tray icon's tool tip, plain on every platform (see
    the module's doc)."""
    s = clean_lines(text)
    return s.replace("<", "<" + WORD_JOINER).replace("&", "&" + WORD_JOINER)


def notification_body(text: object, markup: bool) -> str:
    """`"a <b>&"` → `"a &lt;b&gt;&amp;"` when the notification server reads markup
    (`markup`), else `tray_tip(text)` (see the module's doc); line breaks kept."""
    if markup:
        return html.escape(clean_lines(text), quote=False)
    return tray_tip(text)


def menu_text(text: object) -> str:
    """`"R&D"` → `"R&&D"`: a menu entry's text, one line, no `&` read as a shortcut."""
    return clean(text).replace("&", "&&")
