"""The secret detector behind `find_secret`: which rules, in which order, with their sources.

Rules run in the order of `SECRET_RULES`; the first that matches names the rejection. Vendor
formats come first so that `HF_TOKEN=hf_…` is reported as `huggingface_token`, not as a
generic assignment.

Speed and safety on the hot path (every `lease.acquire`): patterns start with a literal or a
character set, not a lookbehind, so the regex engine skips ahead to candidates; most rules
are skipped outright by a substring gate (`needs`); no pattern nests quantifiers over
overlapping classes, and the only unbounded repetitions are single greedy classes, so every
search is linear in the length of the text (no catastrophic backtracking; see the
pathological-input test). Assignments are found by reading back from each `:`/`=` rather
than trying every key at every position.

Sources of the formats:
- AWS: IAM unique id prefixes (AKIA, ASIA, …) and 40-character secret access keys,
  docs.aws.amazon.com/IAM/latest/UserGuide/reference_identifiers.html.
- Google Cloud: API keys `AIza` + 35 (cloud.google.com/docs/authentication/api-keys);
  service account key files with `private_key_id` / `private_key`
  (cloud.google.com/iam/docs/keys-create-delete);
  OAuth access tokens `ya29.` and client secrets `GOCSPX-` (developers.google.com/identity).
- Azure Storage: connection strings with `AccountKey=` / `SharedAccessKey=`
  (learn.microsoft.com/azure/storage/common/storage-configure-connection-string) and SAS
  tokens carrying `sig=` (learn.microsoft.com/azure/storage/common/storage-sas-overview).
- GitHub `ghp_ gho_ ghu_ ghs_ ghr_ github_pat_` (github.blog, 2021-04-05, "Behind GitHub's new
  authentication token formats"); GitLab `glpat-` and the other prefixes of
  docs.gitlab.com/ee/security/token_overview.html#token-prefixes.
- Slack `xoxb- xoxp- xoxa- xoxr- xoxs- xoxe- xapp-` and incoming webhooks
  (api.slack.com/authentication/token-types); Discord webhooks (discord.com/developers/docs).
- Stripe `sk_live_ rk_live_ sk_test_ rk_test_ pk_… whsec_` (docs.stripe.com/keys).
- OpenAI `sk-`, `sk-proj-`, `sk-svcacct-`, `sk-admin-` (platform.openai.com/docs/api-reference);
  Anthropic `sk-ant-api03-`, `sk-ant-admin01-` (docs.anthropic.com/en/api).
- Hugging Face `hf_`, `api_org_` (huggingface.co/docs/hub/security-tokens); npm `npm_` + 36
  (github.blog, 2021-09-23, npm's new access token format); PyPI macaroons `pypi-AgE…`
  (pypi.org/help/#apitoken); Replicate `r8_`; Groq `gsk_`; Databricks `dapi` + 32 hex.
- Twilio account and API key SIDs `AC`/`SK` + 32 hex (twilio.com/docs/glossary/what-is-a-sid);
  SendGrid `SG.<22>.<43>` (docs.sendgrid.com, API keys); Telegram bot tokens
  `<bot id>:<35 chars>` (core.telegram.org/bots/api#authorizing-your-bot).
- JWT/JWS/JWE compact serialisation (RFC 7519, RFC 7515 §7.1): base64url of a JSON header,
  which always starts `eyJ` (`{"`).
- PEM private keys (RFC 7468 §10–11), OpenSSH private keys, PGP private key blocks
  (RFC 4880 §6.2), PuTTY key files.
- Credentials in URLs: the userinfo `user:password@` of RFC 3986 §3.2.1.
- E-mail addresses: the common `local@domain.tld` form of RFC 5322 §3.4.1.
- Payment cards and high-entropy strings: see `_cards` and `_entropy`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

from rbroker_protocol._assignments import (
    find_authorization,
    find_password_argument,
    find_password_assignment,
)
from rbroker_protocol._cards import find_card
from rbroker_protocol._entropy import find_high_entropy

_A: Final = re.ASCII
_AI: Final = re.ASCII | re.IGNORECASE

_WORD: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_WORD_DASH: Final = _WORD | {"-"}


def _pattern(
    regex: str,
    flags: int = _A,
    glued: frozenset[str] = frozenset(),
    needs: tuple[str, ...] = (),
) -> Callable[[str], int | None]:
    """A rule from one regex: the offset of the first match not glued to a character of
    `glued` on its left (`ghp_…` inside `xghp_…` is not a GitHub token).

    The regex starts with a literal or a character set rather than a lookbehind, so the
    regex engine can skip ahead to candidates; the left edge is checked here instead.
    `needs`: substrings one of which every match contains; without any, the regex is
    skipped (a cheap gate for the hot path).
    """
    compiled = re.compile(regex, flags)

    def search(text: str) -> int | None:
        if needs and not any(n in text for n in needs):
            return None
        match = compiled.search(text)
        while match is not None:
            start = match.start()
            if start == 0 or text[start - 1] not in glued:
                return start
            match = compiled.search(text, _past_run(text, start, glued))
        return None

    return search


def _past_run(text: str, start: int, glued: frozenset[str]) -> int:
    """The first position after `start` that is not glued to its left neighbour.

    Searching again from there, not from `start + 1`, keeps a text like `xsk-sk-sk-…`
    linear: a match glued to its left is part of a longer token, and so is everything up to
    the end of that token.
    """
    pos = start + 1
    while pos < len(text) and text[pos - 1] in glued:
        pos += 1
    return pos


# --- rules that need a look at what matched --------------------------------------------


_OPENAI: Final = re.compile(r"sk-(?:proj-|svcacct-|admin-|None-)?(?P<body>[A-Za-z0-9_-]{20,})", _A)


def _openai_key(text: str) -> int | None:
    """`sk-…` keys: the body must mix upper case, lower case and digits, as random keys do.

    That keeps hyphenated words such as `sk-learn-pipeline-benchmark-2026` out.
    """
    match = _OPENAI.search(text)
    while match is not None:
        start = match.start()
        body = match.group("body")
        if (start == 0 or text[start - 1] not in _WORD_DASH) and (
            "T3BlbkFJ" in body
            or (
                any(c.isupper() for c in body)
                and any(c.islower() for c in body)
                and any(c.isdigit() for c in body)
            )
        ):
            return start
        match = _OPENAI.search(text, _past_run(text, start, _WORD_DASH))
    return None


_URL_USERINFO: Final = re.compile(r"://[^\s/?#@:]*:[^\s/?#@]+@", _A)
_SCHEME_CHARS: Final = _WORD - {"_"} | {"+", ".", "-"}


def _url_credentials(text: str) -> int | None:
    """`scheme://user:password@host` (also `scheme://:password@host`)."""
    match = _URL_USERINFO.search(text) if "@" in text else None
    if match is None:
        return None
    start = match.start()
    while start > 0 and text[start - 1] in _SCHEME_CHARS:
        start -= 1
    return start


_EMAIL: Final = re.compile(
    r"(?<![\w.%+-])(?P<local>[\w.%+-]+)@"
    r"(?P<domain>(?:[\w-]+\.)+(?P<tld>[^\W\d_]{2,}))(?![\w-])"
)
"""Letters of any script in the local part and the domain (RFC 6531): `josé@empresa.es`."""
_FORGE_SSH: Final = frozenset({"github.com", "gitlab.com", "bitbucket.org", "ssh.dev.azure.com"})
_FILE_SUFFIXES: Final = frozenset({
    "pt", "pth", "ckpt", "bin", "safetensors", "onnx", "gguf", "json", "jsonl", "yaml", "yml",
    "toml", "txt", "csv", "tsv", "parquet", "npy", "npz", "h5", "hdf5", "pkl", "py", "ipynb",
    "sh", "md", "png", "jpg", "jpeg", "webp", "wav", "flac", "mp3", "mp4", "mkv", "mov", "tar",
    "gz", "tgz", "zip", "zst", "log",
})  # fmt: skip
"""Names like `model@step.ckpt` and `best@epoch3.pt` are files, not addresses."""


def _email_address(text: str) -> int | None:
    """`local@domain.tld`, except SSH remotes (`git@github.com:org/repo`), `name@file.ext` and
    a user name alone in a URL (`abfss://container@account.dfs.core.windows.net/`)."""
    if "@" not in text:
        return None
    for match in _EMAIL.finditer(text):
        if text.endswith("://", 0, match.start()):
            continue  # URL userinfo without a password: abfss://container@account.dfs…
        domain = match.group("domain").lower()
        if match.group("local") == "git" and domain in _FORGE_SSH:
            continue
        if match.group("tld").lower() in _FILE_SUFFIXES:
            continue
        return match.start()
    return None


# --- the table -------------------------------------------------------------------------

SECRET_RULES: Final[tuple[tuple[str, Callable[[str], int | None]], ...]] = (
    (
        "private_key_block",
        _pattern(
            r"BEGIN[ \t]+(?:[A-Z0-9]+[ \t]+){0,3}PRIVATE[ \t]+KEY|PuTTY-User-Key-File-[0-9]",
            needs=("BEGIN", "PuTTY"),
        ),
    ),
    (
        "aws_access_key",
        _pattern(
            r"A(?:KIA|SIA|BIA|CCA|GPA|IDA|IPA|NPA|NVA|ROA|PKA|SCA)[A-Z0-9]{16}(?![A-Za-z0-9])",
            glued=_WORD,
        ),
    ),
    (
        "aws_secret_key",
        _pattern(
            r"(?:aws|amazon)[A-Za-z0-9_ .-]{0,20}?secret[A-Za-z0-9_ .-]{0,20}?"
            r"[\"']?[ \t]*(?:[:=]|=>|\bis\b)?[ \t]*[\"']?"
            r"(?![0-9a-fA-F]{40}(?![A-Za-z0-9/+]))"  # a commit id after "aws secrets …"
            r"[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+])",
            _AI,
            glued=_WORD - {"_"},
        ),
    ),
    ("google_api_key", _pattern(r"AIza[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])", glued=_WORD_DASH)),
    (
        "gcp_service_account_key",
        _pattern(
            r"private_key(?:_id)?[\"']?[ \t]*:[ \t]*[\"'][^\"']{8,}"
            r"|[\"']type[\"'][ \t]*:[ \t]*[\"']service_account[\"']",
            needs=(":",),
        ),
    ),
    (
        "google_oauth_token",
        _pattern(
            r"ya29\.[0-9A-Za-z_-]{20,}|GOCSPX-[0-9A-Za-z_-]{20,}",
            glued=_WORD_DASH,
            needs=("ya29.", "GOCSPX-"),
        ),
    ),
    (
        "azure_storage_key",
        _pattern(
            r"(?:AccountKey|SharedAccessKey|SharedAccessSignature)[ \t]*=[ \t]*[A-Za-z0-9+/%]{16,}",
            _AI,
            needs=("=",),
        ),
    ),
    ("azure_sas_token", _pattern(r"[?&]sig=[A-Za-z0-9%+/]{16,}", _AI, needs=("=",))),
    (
        "github_token",
        _pattern(r"gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{22,}", glued=_WORD),
    ),
    (
        "gitlab_token",
        _pattern(
            r"gl(?:pat|dt|rt|ptt|cbt|soat|oas|ffct|agent|imt|ft|wt)-[A-Za-z0-9_-]{20,}"
            r"|GR1348941[A-Za-z0-9_-]{20,}",
            glued=_WORD_DASH,
            needs=("gl", "GR1348941"),
        ),
    ),
    (
        "slack_token",
        _pattern(r"xox[abposre]-[A-Za-z0-9-]{10,}|xapp-[0-9]-[A-Za-z0-9-]{10,}", glued=_WORD_DASH),
    ),
    (
        "slack_webhook",
        _pattern(r"hooks\.slack\.com/(?:services|workflows)/[A-Za-z0-9_/]{20,}", _AI),
    ),
    (
        "discord_webhook",
        _pattern(r"discord(?:app)?\.com/api/webhooks/[0-9]+/[A-Za-z0-9_-]{20,}", _AI),
    ),
    (
        "stripe_key",
        _pattern(
            r"(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}|whsec_[A-Za-z0-9]{24,}",
            glued=_WORD,
            needs=("_live_", "_test_", "whsec_"),
        ),
    ),
    (
        "anthropic_key",
        _pattern(r"sk-ant-(?:[a-z]+[0-9]{2}-)?[A-Za-z0-9_-]{20,}", glued=_WORD_DASH),
    ),
    ("openai_key", _openai_key),
    (
        "huggingface_token",
        _pattern(
            r"hf_[A-Za-z0-9]{30,}|api_org_[A-Za-z0-9]{30,}", glued=_WORD, needs=("hf_", "api_org_")
        ),
    ),
    ("npm_token", _pattern(r"npm_[A-Za-z0-9]{36}(?![A-Za-z0-9])", glued=_WORD)),
    ("pypi_token", _pattern(r"pypi-AgE[A-Za-z0-9_-]{40,}", glued=_WORD_DASH)),
    ("replicate_token", _pattern(r"r8_[A-Za-z0-9]{30,}", glued=_WORD)),
    ("groq_key", _pattern(r"gsk_[A-Za-z0-9]{40,}", glued=_WORD)),
    ("databricks_token", _pattern(r"dapi[0-9a-f]{32}(?:-[0-9])?(?![A-Za-z0-9])", glued=_WORD)),
    (
        "twilio_key",
        _pattern(r"(?:AC|SK)[0-9a-f]{32}(?![A-Za-z0-9])", glued=_WORD, needs=("AC", "SK")),
    ),
    ("sendgrid_key", _pattern(r"SG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}", glued=_WORD)),
    (
        "telegram_bot_token",
        _pattern(
            r"[0-9]{8,10}:AA[A-Za-z0-9_-]{33}(?![A-Za-z0-9_-])",
            glued=frozenset("0123456789"),
            needs=(":AA",),
        ),
    ),
    (
        "jwt",
        # The lookbehind after the literal drops `xeyJ…` before the segments are scanned, so
        # a run of `xeyJxeyJ…` costs linear time; `glued` alone would come too late.
        _pattern(r"eyJ(?<![A-Za-z0-9_-]eyJ)[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\."),
    ),
    ("authorization_header", find_authorization),
    ("url_credentials", _url_credentials),
    ("password_assignment", find_password_assignment),
    ("password_argument", find_password_argument),
    ("email_address", _email_address),
    ("payment_card", find_card),
    ("high_entropy", find_high_entropy),
)
"""(kind, search) in the order they run; `search` returns the offset of a match or None."""


def scan(text: str, skip: frozenset[str] = frozenset()) -> tuple[str, int] | None:
    """Return (kind, offset) of the first rule not in `skip` that `text` trips, or None."""
    for kind, search in SECRET_RULES:
        if kind in skip:
            continue
        offset = search(text)
        if offset is not None:
            return kind, offset
    return None
