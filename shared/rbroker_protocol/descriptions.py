"""Rules for declared description fields (owner, project, session, purpose, handler):
architecture.md §8.

The same rules run on the broker (at lease and job declaration) and on the coordinator (on
every report). `check_description` applies them in this order and raises
`DescriptionRejected` naming the first rule broken:

=====================  ==================================================================
rule                   refused when
=====================  ==================================================================
`not_text`             the value is not a `str`
`empty`                nothing but white space
`secret:<kind>`        the text holds a credential or personal data; `SECRET_KINDS` lists
                       the kinds and `rbroker_protocol._secrets` their formats and sources
`too_long`             longer than `MAX_LENGTHS[field]` characters (`DEFAULT_MAX_LENGTH`
                       for other fields)
`control_characters`   any control, format, surrogate, private-use or unassigned code
                       point (Unicode categories Cc, Cf, Cs, Co, Cn) or a line or paragraph
                       separator (Zl, Zp): newlines, tabs, ESC, U+202E right-to-left
                       override, zero-width space and joiners, the byte order mark
`shows_nothing`        nothing visible: only spaces, fillers that render as blanks
                       (`FILLERS`: U+3164 Hangul filler, U+2800 braille blank, …) and
                       combining marks; in a name (`NAME_FIELDS`), any such filler
`combining_marks`      more than `MAX_COMBINING_RUN` combining marks (Mn, Me) in a row:
                       text that smears over its neighbours
`mixed_scripts`        for a name (`NAME_FIELDS`: project, computer name), letters of
                       scripts that are not used together, such as Latin with Cyrillic or
                       Greek (`vіsion` with a Cyrillic `і` passes for `vision`); Latin with
                       one other script, and Han with Hiragana and Katakana, Hangul or
                       Bopomofo, are fine (Unicode TR39's moderately restrictive level)
=====================  ==================================================================

Secrets are looked for first, in the first `SCAN_LIMIT` characters, so that the most
likely accident — a pasted key file or `.env` line, long and multi-line — is reported as
what it is (`secret:private_key_block`), not as `too_long` or `control_characters`, and the
coordinator can flag it. For that look, format characters (zero-width, bidi controls) are
dropped and other control characters read as spaces, so they cannot split a token to hide
it, and the text is put in NFKC form, so full-width letters, digits and colons do not hide
one either. The accepted value is returned as given, only stripped.

Secret kinds, in the order they are checked: `private_key_block`; cloud keys
(`aws_access_key`, `aws_secret_key`, `google_api_key`, `gcp_service_account_key`,
`google_oauth_token`, `azure_storage_key`, `azure_sas_token`); vendor tokens with known
prefixes (`github_token`, `gitlab_token`, `slack_token`, `slack_webhook`, `discord_webhook`,
`stripe_key`, `anthropic_key`, `openai_key`, `huggingface_token`, `npm_token`, `pypi_token`,
`replicate_token`, `groq_key`, `databricks_token`, `twilio_key`, `sendgrid_key`,
`telegram_bot_token`); `jwt`; `authorization_header`; `url_credentials`;
`password_assignment` (`password=…`, `pw: …`, `pass word = …`); `password_argument`
(`--password hunter2`, `mysql -phunter2`, "my password is hunter2", "login with pw hunter2!",
"my secret is hunter22"); `email_address`; `payment_card` (Luhn); `high_entropy`.

What passes on purpose: the bare words ("password-reset model evaluation", "token
classification"), hexadecimal of up to 64 digits (commit ids, digests), UUIDs, ULIDs,
versions, model names, paths, hyphenated run ids, URLs without credentials, long numbers
that are not written like a card of a card network.

One exception by field: an `owner` may look like an e-mail address, since it is the OS
account (read from the connection, never declared) and directory-backed accounts are named
`alice@corp.example.com`.

A rejection names the field, the rule and roughly where the problem starts: never the
value or any part of it, so the error can be logged, stored and sent back safely.

Names are compared by `name_key` (NFKC and case folding): `Vision`, `VISION` and the
full-width `ｖｉｓｉｏｎ` are one project wherever the broker looks a project up
(`[members]`, `[shares]`).
"""

from __future__ import annotations

import functools
import unicodedata
from typing import Final

from rbroker_protocol._secrets import SECRET_RULES, scan

__all__ = [
    "DEFAULT_MAX_LENGTH",
    "MAX_LENGTHS",
    "SCAN_LIMIT",
    "SECRET_KINDS",
    "DescriptionRejected",
    "check_description",
    "find_secret",
    "name_key",
]

MAX_LENGTHS: Final[dict[str, int]] = {
    "owner": 64,
    "project": 64,
    "session": 128,
    "purpose": 200,
    "handler": 128,
    "reason": 200,
}
"""Longest accepted value per field, in characters (code points, not bytes)."""

DEFAULT_MAX_LENGTH: Final = 200
"""Longest accepted value of a field that `MAX_LENGTHS` does not name."""

SCAN_LIMIT: Final = 4096
"""How many characters of a value the secret rules read (enough for a pasted 4096-bit RSA
key); a longer value is refused as `too_long` whatever it holds further on."""

SECRET_KINDS: Final[tuple[str, ...]] = tuple(kind for kind, _ in SECRET_RULES)
"""Every `<kind>` of a `secret:<kind>` rule, in the order they are checked."""

_NOT_SECRETS_IN: Final[dict[str, frozenset[str]]] = {
    "owner": frozenset({"email_address"}),
}
"""Kinds that are no leak in a field: the owner is the OS account, read from the connection,
and directory-backed accounts are named like addresses (`alice@corp.example.com`)."""

_BAD_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})

FILLERS: Final = frozenset("\u115f\u1160\u3164\uffa0\u2800\u17b4\u17b5")
"""Letters and symbols that render as nothing or a blank (Hangul fillers, the braille blank,
Khmer's inherent vowels): a name of these and spaces alone looks empty."""

MAX_COMBINING_RUN: Final = 4
"""Most combining marks (Unicode categories Mn, Me) allowed in a row: enough for stacked
diacritics in Vietnamese, Hebrew or Tibetan, not for text that smears over its line."""

NAME_FIELDS: Final = frozenset({"project", "computer_name"})
"""Fields that name something others are shown as the same thing: checked for
`mixed_scripts` too."""

_SCRIPT_SETS: Final = (
    frozenset({"LATIN", "CJK", "HIRAGANA", "KATAKANA"}),
    frozenset({"LATIN", "CJK", "HANGUL"}),
    frozenset({"LATIN", "CJK", "BOPOMOFO"}),
)
"""Scripts written together (TR39 §5.2, moderately restrictive: Japanese, Korean, Chinese
with Bopomofo, each with Latin)."""

_NOT_WITH_LATIN: Final = frozenset(
    {"CYRILLIC", "GREEK", "CHEROKEE", "ARMENIAN", "COPTIC", "LISU", "OLD", "GEORGIAN"}
)
"""Scripts with letters that pass for Latin ones (Armenian `օ`, Coptic `ⲓ`, Lisu `ꓦ`, Old
Italic, Georgian `ⴸ`…): never mixed with Latin in a name."""

_LATIN_LOOKALIKES: Final = str.maketrans({"\u0131": "i", "\u0237": "j"})
"""Latin letters that `name_key` folds to the letter they pass for (dotless `ı`, `ȷ`)."""

_SECRET_LABELS: Final[dict[str, str]] = {
    "private_key_block": "a private key block",
    "aws_access_key": "an AWS access key id",
    "aws_secret_key": "an AWS secret access key",
    "google_api_key": "a Google API key",
    "gcp_service_account_key": "a Google Cloud service account key",
    "google_oauth_token": "a Google OAuth token or client secret",
    "azure_storage_key": "an Azure storage key or connection string",
    "azure_sas_token": "an Azure shared access signature",
    "github_token": "a GitHub token",
    "gitlab_token": "a GitLab token",
    "slack_token": "a Slack token",
    "slack_webhook": "a Slack webhook URL",
    "discord_webhook": "a Discord webhook URL",
    "stripe_key": "a Stripe key",
    "anthropic_key": "an Anthropic API key",
    "openai_key": "an OpenAI API key",
    "huggingface_token": "a Hugging Face token",
    "npm_token": "an npm token",
    "pypi_token": "a PyPI token",
    "replicate_token": "a Replicate token",
    "groq_key": "a Groq API key",
    "databricks_token": "a Databricks token",
    "twilio_key": "a Twilio account or key id",
    "sendgrid_key": "a SendGrid API key",
    "telegram_bot_token": "a Telegram bot token",
    "jwt": "a JSON Web Token",
    "authorization_header": "an HTTP Authorization header or bearer token",
    "url_credentials": "a URL with a user name and password",
    "password_assignment": "a password, secret or token assignment",
    "password_argument": "a password given as a command-line argument or in prose",
    "email_address": "an e-mail address",
    "payment_card": "a payment card number",
    "high_entropy": "a long random-looking string (a key or token?)",
}


class DescriptionRejected(ValueError):
    """A description broke a rule. `rule` names it; the message never contains the value.

    Attributes:
        field: which field (`project`, `purpose`, ...).
        rule: the rule's stable name (`not_text`, `empty`, `too_long`,
            `control_characters`, `shows_nothing`, `combining_marks`, `mixed_scripts`,
            `secret:<kind>`).
        detail: a human explanation, free of the value.
    """

    def __init__(self, field: str, rule: str, detail: str) -> None:
        super().__init__(f"{field} rejected by rule {rule}: {detail}")
        self.field = field
        self.rule = rule
        self.detail = detail

    def __reduce__(self) -> tuple[type[DescriptionRejected], tuple[str, str, str]]:
        return type(self), (self.field, self.rule, self.detail)


def find_secret(value: str) -> str | None:
    """Return the kind (`github_token`, `payment_card`, ...) of the first secret rule that
    `value` trips, or None. The value itself, or any part of it, is never returned.

    Reads the whole value (`check_description` passes at most `SCAN_LIMIT` characters);
    linear in its length.
    """
    found = scan(_for_scanning(value))
    return None if found is None else found[0]


def _for_scanning(text: str) -> str:
    """The text the secret rules read: no format characters, other controls as spaces, NFKC."""
    if text.isascii():
        if text.isprintable():
            return text  # the hot path: nothing to change
        return text.translate(_ASCII_CONTROLS_TO_SPACES)
    if not _printable(text):
        text = "".join(_visible(ch) for ch in text)
    return unicodedata.normalize("NFKC", text)


_SPACE_SEPARATORS: Final = {
    cp: " " for cp in (0xA0, 0x1680, *range(0x2000, 0x200B), 0x202F, 0x205F, 0x3000)
}
"""Unicode's space separators (Zs) other than U+0020, which `str.isprintable` refuses."""


def _printable(text: str) -> bool:
    """No character of `_BAD_CATEGORIES`, at C speed (spaces such as U+3000 are fine)."""
    return text.isprintable() or text.translate(_SPACE_SEPARATORS).isprintable()


_ASCII_CONTROLS_TO_SPACES: Final = {c: " " for c in [*range(0x20), 0x7F]}


def _visible(ch: str) -> str:
    category = unicodedata.category(ch)
    if category == "Cf":
        return ""
    return " " if category in _BAD_CATEGORIES else ch


def _first_bad_character(text: str) -> tuple[int, str] | None:
    if _printable(text):
        return None
    for i, ch in enumerate(text):
        if unicodedata.category(ch) in _BAD_CATEGORIES:
            return i, ch
    return None


def check_description(field: str, value: object) -> str:
    """Validate one description field and return it stripped of surrounding white space.

    Args:
        field: one of `MAX_LENGTHS`' keys (others get `DEFAULT_MAX_LENGTH`).
        value: the declared text.

    Returns:
        The value with surrounding white space removed. Checking the result again returns
        it unchanged.

    Raises:
        DescriptionRejected: see the module docstring for the rules and their order. The
            message names the field, the rule and roughly where the problem starts, never
            the value.
    """
    if not isinstance(value, str):
        raise DescriptionRejected(field, "not_text", f"expected text, got {type(value).__name__}")
    return _check_text(field, value)


@functools.lru_cache(maxsize=4096)
def _check_text(field: str, value: str) -> str:
    """`check_description` for text. Accepted values are remembered (the same project and
    purpose texts come with every lease and every report); refusals raise, so a rejected
    value is never kept."""
    text = value.strip()
    if not text:
        raise DescriptionRejected(field, "empty", "must not be empty")
    found = scan(_for_scanning(text[:SCAN_LIMIT]), _NOT_SECRETS_IN.get(field, frozenset()))
    if found is not None:
        kind, offset = found
        raise DescriptionRejected(
            field,
            f"secret:{kind}",
            f"looks like {_SECRET_LABELS.get(kind, 'a secret')} near character {offset + 1}; "
            "describe the work without credentials or personal data",
        )
    limit = MAX_LENGTHS.get(field, DEFAULT_MAX_LENGTH)
    if len(text) > limit:
        raise DescriptionRejected(
            field, "too_long", f"{len(text)} characters, at most {limit} allowed"
        )
    bad = _first_bad_character(text)
    if bad is not None:
        position, ch = bad
        raise DescriptionRejected(
            field,
            "control_characters",
            f"control or invisible character U+{ord(ch):04X} ({unicodedata.category(ch)}) "
            f"at character {position + 1}; only printable text is allowed",
        )
    if not text.isascii():
        _check_shape(field, text)
    return text


def _check_shape(field: str, text: str) -> None:
    """The rules for what non-ASCII text looks like: `shows_nothing`, `combining_marks`, and
    `mixed_scripts` for `NAME_FIELDS`."""
    run = longest = 0
    visible = False
    for ch in text:
        category = unicodedata.category(ch)
        if category in ("Mn", "Me"):
            run += 1
            longest = max(longest, run)
            continue
        run = 0
        if category != "Zs" and ch not in FILLERS:
            visible = True
    if not visible:
        raise DescriptionRejected(
            field, "shows_nothing", "only spaces, blank fillers or combining marks"
        )
    if longest > MAX_COMBINING_RUN:
        raise DescriptionRejected(
            field,
            "combining_marks",
            f"{longest} combining marks in a row, at most {MAX_COMBINING_RUN} allowed",
        )
    if field in NAME_FIELDS:
        hidden = next((i for i, ch in enumerate(text) if ch in FILLERS), None)
        if hidden is not None:  # `vision` + U+17B4 draws as `vision`
            raise DescriptionRejected(
                field,
                "shows_nothing",
                f"a character that shows nothing (U+{ord(text[hidden]):04X}) at character "
                f"{hidden + 1}; a name must be what it looks like",
            )
        scripts = _scripts(text)
        if not _scripts_go_together(scripts):
            raise DescriptionRejected(
                field,
                "mixed_scripts",
                f"letters of {' and '.join(sorted(s.title() for s in scripts))} script "
                "together can pass for another name; write it in one script",
            )


def _scripts(text: str) -> set[str]:
    """The scripts of the letters of `text` in NFKC form (full-width Latin is Latin), by the
    first word of each letter's Unicode name (`CYRILLIC SMALL LETTER I` → CYRILLIC);
    modifier letters (Lm) and non-letters are of no script."""
    found = set()
    for ch in unicodedata.normalize("NFKC", text):
        if unicodedata.category(ch) in ("Lu", "Ll", "Lt", "Lo"):
            found.add(unicodedata.name(ch, "UNKNOWN").split(" ", 1)[0])
    return found


def _scripts_go_together(scripts: set[str]) -> bool:
    """Whether a name may be written in `scripts` together (`_SCRIPT_SETS`, or Latin with one
    other script that does not pass for Latin)."""
    if len(scripts) <= 1 or any(scripts <= allowed for allowed in _SCRIPT_SETS):
        return True
    others = scripts - {"LATIN"}
    return len(others) == 1 and "LATIN" in scripts and not others & _NOT_WITH_LATIN


def name_key(name: str) -> str:
    """What two names are compared by: NFKC, case folded, NFKC again (folding can undo the
    normal form), Latin lookalikes folded (`_LATIN_LOOKALIKES`), stripped: `Vision`,
    `VISION`, `ｖｉｓｉｏｎ` and `vısion` → `vision`."""
    folded = unicodedata.normalize("NFKC", name).casefold()
    return unicodedata.normalize("NFKC", folded).translate(_LATIN_LOOKALIKES).strip()
