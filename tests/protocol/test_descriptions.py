"""Description rules (architecture.md §8): text rules, each secret rule, near misses, no echo,
linearity."""

from __future__ import annotations

import base64
import contextlib
import json
import pickle
import random
import string
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rbroker_protocol import _cards, descriptions
from rbroker_protocol.descriptions import (
    DEFAULT_MAX_LENGTH,
    MAX_LENGTHS,
    SCAN_LIMIT,
    SECRET_KINDS,
    DescriptionRejected,
    check_description,
    find_secret,
)

_rng = random.Random(7)
_ALNUM = string.ascii_letters + string.digits
_B64URL = _ALNUM + "-_"


def _rand(n: int, alphabet: str = _ALNUM) -> str:
    return "".join(_rng.choice(alphabet) for _ in range(n))


def _b64url_json(obj: object) -> str:
    raw = json.dumps(obj, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _luhn_complete(prefix: str, length: int) -> str:
    body = prefix + _rand(length - len(prefix) - 1, string.digits)
    return next(body + d for d in string.digits if _cards.luhn_ok(body + d))


def _rejected(text: str, field: str = "purpose") -> DescriptionRejected:
    with pytest.raises(DescriptionRejected) as info:
        check_description(field, text)
    return info.value


# --- the text rules --------------------------------------------------------------------


def test_accepts_and_strips() -> None:
    assert check_description("purpose", "  fine-tune Llama-3.1-8B on tickets \n") == (
        "fine-tune Llama-3.1-8B on tickets"
    )


def test_rejection_is_a_value_error_with_field_rule_and_detail() -> None:
    exc = _rejected("", field="project")
    assert isinstance(exc, ValueError)
    assert (exc.field, exc.rule) == ("project", "empty")
    assert str(exc) == f"project rejected by rule empty: {exc.detail}"


def test_rejection_survives_pickling() -> None:
    exc = _rejected("ghp_" + _rand(36))
    copy = pickle.loads(pickle.dumps(exc))
    assert (copy.field, copy.rule, copy.detail, str(copy)) == (
        exc.field,
        exc.rule,
        exc.detail,
        str(exc),
    )


@pytest.mark.parametrize("value", [None, 42, 3.5, b"train resnet", ["train"], {"p": "x"}])
def test_non_text_is_refused(value: object) -> None:
    with pytest.raises(DescriptionRejected) as info:
        check_description("purpose", value)
    assert info.value.rule == "not_text"
    assert type(value).__name__ in info.value.detail


@pytest.mark.parametrize("value", ["", " ", "\u3000 ", "   \t"])
def test_empty_is_refused(value: str) -> None:
    # A tab inside would be a control character; around the text it is stripped white space.
    assert _rejected(value).rule == "empty"


@pytest.mark.parametrize(("field", "limit"), sorted(MAX_LENGTHS.items()))
def test_length_limit_per_field(field: str, limit: int) -> None:
    assert check_description(field, "a" * limit) == "a" * limit
    exc = _rejected("a" * (limit + 1), field=field)
    assert exc.rule == "too_long"
    assert str(limit) in exc.detail and str(limit + 1) in exc.detail


def test_length_counts_characters_not_bytes_and_ignores_surrounding_space() -> None:
    limit = MAX_LENGTHS["project"]
    text = "é" * limit  # twice as many UTF-8 bytes
    assert check_description("project", f"  {text}  ") == text


def test_text_rule_messages_do_not_echo_the_value() -> None:
    for value, rule in [("Q7x" * 100, "too_long"), ("zebracorn\u202eQ7x", "control_characters")]:
        exc = _rejected(value)
        assert exc.rule == rule
        assert "Q7x" not in str(exc) and "zebra" not in str(exc)


def test_unknown_field_gets_the_default_limit() -> None:
    assert check_description("note", "a" * DEFAULT_MAX_LENGTH)
    assert _rejected("a" * (DEFAULT_MAX_LENGTH + 1), field="note").rule == "too_long"


@pytest.mark.parametrize(
    "char",
    [
        "\n",
        "\r",
        "\t",
        "\x00",
        "\x1b",  # ESC: terminal escape sequences
        "\x7f",
        "\x85",  # NEL
        "\u202e",  # right-to-left override
        "\u2066",  # left-to-right isolate
        "\u200b",  # zero-width space
        "\u200c",  # zero-width non-joiner
        "\u200d",  # zero-width joiner
        "\u2060",  # word joiner
        "\ufeff",  # byte order mark
        "\u00ad",  # soft hyphen
        "\u2028",  # line separator
        "\u2029",  # paragraph separator
        "\ud800",  # lone surrogate
        "\ue000",  # private use
        "\U000e0041",  # tag character
        "\u0378",  # unassigned
    ],
)
def test_control_and_invisible_characters_are_refused(char: str) -> None:
    exc = _rejected(f"train model{char}v2 on data")
    assert exc.rule == "control_characters"
    assert f"U+{ord(char):04X}" in exc.detail
    assert "train" not in str(exc)


@pytest.mark.parametrize(
    "text",
    [
        "日本語の説明\u3000全角スペース付き",
        "no-break\u00a0space",
        "cafe\u0301 with a combining accent",
        "launch 🚀 render job",
        "Ελληνικά, русский, العربية, עברית",
    ],
)
def test_printable_unicode_passes(text: str) -> None:
    assert check_description("purpose", text) == text


def test_the_space_separator_table_is_complete() -> None:
    spaces = {cp for cp in range(0x110000) if unicodedata.category(chr(cp)) == "Zs" and cp != 0x20}
    assert spaces == set(descriptions._SPACE_SEPARATORS)


# --- secret rules: one realistic example per kind ----------------------------------------

_JWT = (
    _b64url_json({"alg": "HS256", "typ": "JWT"})
    + "."
    + _b64url_json({"sub": "svc-trainer", "iat": 1764489600})
    + "."
    + _rand(43, _B64URL)
)

SECRET_EXAMPLES: list[tuple[str, str, str]] = [
    # (kind, secret, sentence with {} where the secret goes)
    ("private_key_block", "-----BEGIN OPENSSH PRIVATE KEY-----" + _rand(30), "deploy key {}"),
    ("aws_access_key", "AKIA" + _rand(16, string.ascii_uppercase + "234567"), "s3 key {} ok"),
    ("aws_secret_key", _rand(40, _ALNUM + "+/"), "aws_secret_access_key={} for s3"),
    ("google_api_key", "AIza" + _rand(35, _B64URL), "maps key {} geocoding"),
    ("gcp_service_account_key", _rand(40, "0123456789abcdef"), '"private_key_id": "{}"'),
    ("google_oauth_token", "ya29." + _rand(50, _B64URL), "drive export with {}"),
    ("azure_storage_key", _rand(86, _ALNUM + "+/") + "==", "AccountName=acme;AccountKey={}"),
    ("azure_sas_token", _rand(43), "https://a.blob.core.windows.net/c?sp=r&sig={}%3D"),
    ("github_token", "ghp_" + _rand(36), "clone with {}"),
    ("github_token", "github_pat_" + _rand(22) + "_" + _rand(59), "release with {}"),
    ("gitlab_token", "glpat-" + _rand(20, _B64URL), "mirror with {}"),
    ("slack_token", "xoxb-" + _rand(12, string.digits) + "-" + _rand(24), "notify via {}"),
    (
        "slack_webhook",
        "hooks.slack.com/services/T"
        + _rand(8).upper()
        + "/B"
        + _rand(10).upper()
        + "/"
        + _rand(24),
        "post to https://{}",
    ),
    (
        "discord_webhook",
        "discord.com/api/webhooks/" + _rand(18, string.digits) + "/" + _rand(68, _B64URL),
        "post to https://{}",
    ),
    ("stripe_key", "sk_live_" + _rand(24), "invoices via {}"),
    ("stripe_key", "rk_live_" + _rand(24), "invoices via {}"),
    ("anthropic_key", "sk-ant-api03-" + _rand(60, _B64URL), "judge with {}"),
    ("openai_key", "sk-proj-" + _rand(48, _B64URL), "label with {}"),
    ("openai_key", "sk-" + _rand(20) + "T3BlbkFJ" + _rand(20), "embed with {}"),
    ("huggingface_token", "hf_" + _rand(34, string.ascii_letters), "gated weights, {}"),
    ("npm_token", "npm_" + _rand(36), "publish with {}"),
    ("pypi_token", "pypi-AgEIcHlwaS5vcmc" + _rand(50, _B64URL), "upload with {}"),
    ("replicate_token", "r8_" + _rand(37), "compare with {}"),
    ("groq_key", "gsk_" + _rand(52), "judge with {}"),
    ("databricks_token", "dapi" + _rand(32, "0123456789abcdef"), "features via {}"),
    ("twilio_key", "AC" + _rand(32, "0123456789abcdef"), "sms via {}"),
    ("sendgrid_key", "SG." + _rand(22, _B64URL) + "." + _rand(43, _B64URL), "mail via {}"),
    (
        "telegram_bot_token",
        _rand(10, string.digits) + ":AA" + _rand(33, _B64URL),
        "bot {} notifies",
    ),
    ("jwt", _JWT, "gateway with bearer {}"),
    (
        "authorization_header",
        base64.b64encode(b"trainer:" + _rand(12).encode()).decode(),
        "curl with Authorization: Basic {}",
    ),
    ("authorization_header", _rand(32), "call the endpoint with Bearer {}"),
    ("url_credentials", "mlops:" + _rand(12) + "@db.internal", "write to postgres://{}/m"),
    ("password_assignment", "Tr0ub4dor&3", "connect with password={}"),
    ("password_assignment", "hunter2", "passwd: {} on the shared box"),
    ("password_assignment", "swordfish", "the password is: {}"),
    ("password_assignment", "Autumn2026!", "PASSWORD => {}"),
    ("password_assignment", _rand(24), "api_key={} weather"),
    ("password_assignment", _rand(16), "DB_PASSWORD={} export"),
    ("password_assignment", _rand(24), "secret: {}"),
    ("password_assignment", _rand(24), "token: {} internal"),
    ("password_assignment", "Sakura2026", "パスワード：{} で接続"),
    ("password_assignment", "Geheim123", "Passwort: {} für den Export"),
    ("password_argument", "hunter2", "run the loader with --password {}"),
    ("password_argument", "hunter2", "dump with mysql -u root -p{} first"),
    ("password_argument", "hunter2", "passwd {}"),
    ("password_argument", "Tr0ub4dor&3", "db pass: {}"),
    ("password_argument", "hunter2", "train with my password {}"),
    ("email_address", "alice.smith@example.com", "results to {}"),
    ("email_address", "josé.garcía@empresa.es", "resultados a {}"),
    ("email_address", "müller@firma.de", "Ergebnisse an {}"),
    ("payment_card", _luhn_complete("4", 16), "card {} for billing"),
    ("payment_card", "5555 5555 5555 4444", "card {} for billing"),
    ("payment_card", "3782-822463-10005", "amex {}"),
    ("high_entropy", _rand(40), "internal service key {} attached"),
    ("high_entropy", base64.b64encode(_rng.randbytes(30)).decode(), "nonce {} replay"),
]


def test_every_secret_kind_has_an_example() -> None:
    assert {kind for kind, _, _ in SECRET_EXAMPLES} == set(SECRET_KINDS)


@pytest.mark.parametrize(
    ("kind", "secret", "sentence"),
    SECRET_EXAMPLES,
    ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(SECRET_EXAMPLES)],
)
def test_secret_rule(kind: str, secret: str, sentence: str) -> None:
    text = sentence.format(secret)
    assert find_secret(text) == kind
    exc = _rejected(text)
    assert exc.rule == f"secret:{kind}"
    for message in (str(exc), exc.detail, repr(exc), repr(exc.args)):
        for i in range(len(secret) - 7):
            assert secret[i : i + 8] not in message


def test_every_secret_kind_is_documented_and_labelled() -> None:
    doc = descriptions.__doc__ or ""
    for kind in SECRET_KINDS:
        assert f"`{kind}`" in doc, kind
    assert set(descriptions._SECRET_LABELS) == set(SECRET_KINDS)


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("DB_PASSWORD=x7Gq2mZ9 export", "password_assignment"),
        ('config {"password": "x7Gq2mZ9"}', "password_assignment"),
        ("accessToken=" + "Zq3" * 8, "password_assignment"),
        ("HFTOKEN=" + "Zq3" * 8, "password_assignment"),
        ("mot de passe : Soleil2026 pour le NAS", "password_assignment"),
        ("the password is: swordfish", "password_assignment"),
        ("Authorization: token " + "a1" * 20, "authorization_header"),
    ],
)
def test_assignment_shapes(text: str, kind: str) -> None:
    assert find_secret(text) == kind


@pytest.mark.parametrize(
    "text",
    [
        "--password hunter2",
        "mysql -u root -phunter2",
        "passwd hunter2",
        "db pass: Tr0ub4dor&3",
        "train with my password hunter2",
        "my password is hunter2",
        "eval --db-password s3cret!x on the nightly set",
        "--passwd swordfish for the box",  # a flag takes any value, plain words too
        "sshpass -p hunter2 ssh gpu1",
        "mariadb --user=ml -pTr0ub4dor&3 < dump.sql",
        "the pass is Tr0ub4dor&3",
    ],
)
def test_passwords_typed_on_command_lines_and_in_prose_are_refused(text: str) -> None:
    assert find_secret(text) == "password_argument"


@pytest.mark.parametrize(
    "text",
    [
        "reset password page classifier",
        "passwordless ssh to the cluster",
        "password-reset intent classifier",
        "train a password strength meter on synthetic passwords",
        "password hashing benchmark v2",
        "evaluate the password policy classifier, model pwpolicy-v2",
        "forward pass: bf16",
        "second pass 2x faster",
        "first pass: 512 tokens",
        "pass rate 0.95 on eval",
        "bypass the cache for the sweep",
        "--password $DB_PASS",  # a placeholder, not a password
        "--password <secret> from the vault",
        "mysql -u root -p$MYSQL_PWD",
        "mysql -p at the prompt",
        "psql -p 5432 analytics",  # not a MySQL client: -p is the port
        "ssh -p2222 gpu1",
        "compass calibration run",
    ],
)
def test_purposes_that_mention_passwords_pass(text: str) -> None:
    assert find_secret(text) is None


@pytest.mark.parametrize(
    ("kind", "text"),
    [
        ("aws_access_key", "sync with AKIAIOSFODNN7EXAMPLE"),
        ("aws_secret_key", "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
        ("stripe_key", "charge with sk_test_4eC39HqLyjWDarjtT1zdp7dc"),
        ("slack_token", "notify xoxb-17653672481-19874698323-pdFZKVeTuE8sk7oOcBrzbqgy"),
        ("google_api_key", "geocode with AIzaSyDaGmWKa4JsXZ-HjGw7ISLn_3namBGewQe"),
        (
            "jwt",
            "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9l"
            "IiwiaWF0IjoxNTE2MjM5MDIyfQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
        ),
        ("url_credentials", "engine postgresql+psycopg2://scott:tiger@localhost/test"),
        ("payment_card", "test card 4242 4242 4242 4242"),
    ],
)
def test_published_documentation_examples(kind: str, text: str) -> None:
    """The example values in the vendors' own documentation (not secrets, but their shape)."""
    assert find_secret(text) == kind


def test_an_owner_may_be_a_directory_account_named_like_an_address() -> None:
    assert check_description("owner", "alice@corp.example.com") == "alice@corp.example.com"
    assert _rejected("alice@corp.example.com", field="project").rule == "secret:email_address"
    assert _rejected("ghp_" + _rand(36), field="owner").rule == "secret:github_token"


def test_vendor_format_wins_over_the_generic_assignment() -> None:
    token = "hf_" + _rand(34, string.ascii_letters)
    assert find_secret(f"HF_TOKEN={token}") == "huggingface_token"


def test_secret_inside_cjk_text_without_spaces() -> None:
    assert find_secret("トークンghp_" + _rand(36) + "でリポジトリを取得") == "github_token"


def test_full_width_characters_do_not_hide_a_secret() -> None:
    full_width = "ｐａｓｓｗｏｒｄ＝ｈｕｎｔｅｒ２ｈｕｎｔｅｒ"
    assert _rejected(f"eval {full_width}").rule == "secret:password_assignment"
    card = "".join(chr(ord(c) + 0xFEE0) if c.isdigit() else c for c in "4111 1111 1111 1111")
    assert _rejected(f"card {card}").rule == "secret:payment_card"


def test_find_secret_is_none_for_clean_text() -> None:
    assert find_secret("train resnet50 on /data/imagenet/train, batch 256") is None


# --- near misses: must pass --------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "password-reset model evaluation",
        "password reset intent classifier",
        "token classification on CoNLL-2003",
        "secret santa image generation",
        "API key rotation anomaly detector",
        "train the credential stuffing detector",
        "sk-learn-pipeline-benchmark-2026 baseline",
        "eval checkpoint at commit 3f2a9c1d8e7b6a5f4e3d2c1b0a9f8e7d6c5b4a39",
        "digest sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        "md5 d41d8cd98f00b204e9800998ecf8427e",
        "run 7f3e9a2b-1c4d-4e5f-8a6b-9c0d1e2f3a4b",
        "GPU-5a1e0000-0000-0000-0000-000000000001 burn-in",
        "MIG-GPU-5a1e0000-0000-0000-0000-000000000001/1/0 slice test",
        "release v2.14.0-rc.3+build.1729",
        "fine-tune meta-llama/Llama-3.1-8B-Instruct",
        "nvidia/Llama-3.1-Nemotron-70B-Instruct-HF judge",
        "/data/imagenet/train/n01440764/n01440764_10026.JPEG",
        "run-2026-11-30-a7 sweep",
        "kubernetes pod trainer-7d9f8c6b5-x2k4p restarted",
        "flash_attn-2.6.3+cu123torch2.4cxx11abiFALSE-cp311-cp311-linux_x86_64.whl",
        "llama3_8b_sft_lr2e-5_bs128_ep3_20261130",
        "resnet50v2imagenet1k baseline",
        "pad_token=eos_token, max_new_tokens=512",
        "token budget: 4096",
        "token: 512 context",
        "secret: none",
        "secret: classified dataset, handle per policy",
        "credentials: read-only, in the team vault",
        "the bearer of bad news classifier",
        "bearer token refresh latency study",
        "Authorization: see the team wiki",
        "ntoken=12345678 for the synthetic benchmark",
        "token: 日本語トークナイザの評価",
        "authorization flow model for loan decisions",
        "HuggingFaceH4/zephyr-7b-beta and HuggingFaceTB/SmolLM2-1.7B-Instruct",
        "run 01JD2W4T7X9K3M5N8P0Q2R4S6V (a ULID)",
        "abfss://lake@acmedatalake.dfs.core.windows.net/bronze/events",
        "password: ***",
        "api_key=$OPENAI_API_KEY from the environment",
        "HF_TOKEN=${HF_TOKEN}",
        "token=<redacted>",
        "pwd=/home/jdoe/project",
        "clone git@github.com:acme/models.git",
        "compute metrics for best@epoch3.ckpt",
        "https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct",
        "serve on https://inference.internal:8443/v1/chat",
        "s3://acme-ml-prod/checkpoints/2026/11/30/step_000120000/",
        "steps 4111111111111112 (not a Luhn number)",
        "timestamp 1764489600000 to 1764576000000",
        "snowflake id 1301234567890123456",
        "dataset of 4294967296 tokens, 1099511627776 bytes",
        "EAN 4006381333931 barcode model",
        "ISBN 978-3-16-148410-0 covers",
        "date range 2026-11-01 2026-11-30 1200 runs",
        "wandb run 3kx9z2ab",
        "aws secrets manager sync at commit 3f2a9c1d8e7b6a5f4e3d2c1b0a9f8e7d6c5b4a39",
    ],
)
def test_near_misses_pass(text: str) -> None:
    assert check_description("purpose", text) == text


def test_luhn() -> None:
    assert _cards.luhn_ok("4111111111111111")
    assert _cards.luhn_ok("378282246310005")
    assert not _cards.luhn_ok("4111111111111112")


@pytest.mark.parametrize(
    "text",
    [
        "4111 1111 1111 1112",  # Luhn fails
        "1000 0000 0000 0008",  # Luhn passes, no card network starts with 1
        "41 1111 1111 1111 11",  # not a card layout
        "4111 1111-1111 1111",  # mixed separators
        "x4111111111111111",  # glued to a token
    ],
)
def test_numbers_that_are_not_cards(text: str) -> None:
    assert find_secret(f"id {text} run") is None


# --- properties --------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_any_text_is_accepted_or_rejected_with_a_rule(text: str) -> None:
    try:
        result = check_description("purpose", text)
    except DescriptionRejected as exc:
        assert exc.rule in {"empty", "too_long", "control_characters"} or (
            exc.rule.removeprefix("secret:") in SECRET_KINDS
        )
    else:
        assert check_description("purpose", result) == result


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=2000))
def test_find_secret_never_fails(text: str) -> None:
    assert find_secret(text) in (None, *SECRET_KINDS)


@settings(max_examples=200, deadline=None)
@given(
    st.text(alphabet=string.ascii_letters + string.digits + " -_/.:=@+", min_size=1, max_size=150),
    st.sampled_from(["\u202e", "\u200b", "\x1b", "\n", "\ufeff"]),
    st.integers(min_value=0, max_value=150),
)
def test_an_inserted_control_character_is_always_found(text: str, char: str, at: int) -> None:
    at = min(at, len(text))
    value = "x" + text[:at] + char + text[at:] + "x"
    rule = _rejected(value).rule
    # Secrets are reported first; otherwise the character is.
    assert rule == "control_characters" or rule.startswith("secret:")
    if find_secret(value) is None:
        assert rule == "control_characters"


def test_secrets_are_reported_before_length_and_control_characters() -> None:
    """A pasted key file is long and multi-line; it is reported as the secret it is."""
    pem = "-----BEGIN RSA PRIVATE KEY-----\n" + "\n".join(_rand(64) for _ in range(25))
    assert _rejected(f"deploy with\n{pem}\n-----END RSA PRIVATE KEY-----").rule == (
        "secret:private_key_block"
    )
    assert _rejected("eval\nHF_TOKEN=hf_" + _rand(34, string.ascii_letters)).rule == (
        "secret:huggingface_token"
    )


def test_invisible_characters_do_not_split_a_token_to_hide_it() -> None:
    token = "ghp_" + _rand(18) + "\u200b" + _rand(18)
    assert _rejected(f"clone with {token}").rule == "secret:github_token"


def test_secrets_beyond_the_scan_limit_are_too_long() -> None:
    value = "a " * (SCAN_LIMIT // 2) + "ghp_" + _rand(36)
    assert _rejected(value).rule == "too_long"


# --- linear time ------------------------------------------------------------------------

_PATHOLOGICAL_UNITS = [
    "a", "@", "a@", "a.", "a@a.", "0 ", "0-", "0", "1111 ", "password=", "password", "sk-",
    "://:", ":", "-", "AKIA", "eyJ.", "aws secret ", "Ab1", "A1b2C3/+", "x=", "BEGIN ", "a:",
    "ghp_", "=", "'", '"private_key":', "token:", "__", "a-a-a- ", "hf_", "AccountKey=",
    "?sig=", "ya29.", "1:AA", "xsk-", "xglpat-", "xAKIA", "xhf_", "xeyJ", "é@", "日本@",
]  # fmt: skip


@pytest.mark.parametrize("unit", _PATHOLOGICAL_UNITS)
def test_pathological_inputs_finish(unit: str) -> None:
    """Repetitive input is where backtracking regexes blow up; these must simply finish."""
    for size in (200, SCAN_LIMIT + 1):
        with contextlib.suppress(DescriptionRejected):
            check_description("purpose", (unit * size)[:size])


@pytest.mark.slow
@pytest.mark.timeout(15)  # a guard against super-linear patterns, not a timing assertion
@pytest.mark.parametrize("unit", _PATHOLOGICAL_UNITS)
def test_pathological_inputs_scan_in_linear_time(unit: str) -> None:
    """Every pattern is linear, so 300 000 characters take a fraction of a second; one that
    rescans the rest of a run at each candidate (quadratic) takes far beyond the guard."""
    find_secret((unit * 300_000)[:300_000])


@pytest.mark.parametrize(
    ("field", "text", "rule"),
    [
        ("purpose", "\u3164", "shows_nothing"),
        ("purpose", "\u2800 \u2800", "shows_nothing"),
        ("purpose", "\u0301\u0301", "shows_nothing"),
        ("session", "\uffa0\u3000\u115f", "shows_nothing"),
        ("purpose", "z" + "\u0489" * 5, "combining_marks"),
        ("purpose", "train" + "\u0336\u0337\u0338\u0334\u0335" + " model", "combining_marks"),
        ("project", "v\u0456sion", "mixed_scripts"),
        ("project", "\u0430\u0440ple", "mixed_scripts"),
        ("project", "\u03b1lpha", "mixed_scripts"),
        ("computer_name", "lab-gpu-\u043e1", "mixed_scripts"),
        ("project", "\u0432\u0438\u0434\u03b5\u03bf", "mixed_scripts"),  # Cyrillic, Greek
        ("project", "visi\u0585n", "mixed_scripts"),  # Armenian օ
        ("project", "visio\u0578", "mixed_scripts"),  # Armenian ո
        ("project", "vis\u2c93on", "mixed_scripts"),  # Coptic ⲓ
        ("project", "\ua4e6ision", "mixed_scripts"),  # Lisu ꓦ
        ("project", "vision\u17b4", "shows_nothing"),  # a Khmer vowel that draws nothing
        ("computer_name", "lab\u3164gpu", "shows_nothing"),
    ],
)
def test_text_that_shows_nothing_smears_or_passes_for_another_name_is_refused(
    field: str, text: str, rule: str
) -> None:
    with pytest.raises(DescriptionRejected) as exc:
        check_description(field, text)
    assert exc.value.rule == rule and exc.value.field == field
    assert text.strip() not in str(exc.value)


@pytest.mark.parametrize(
    ("field", "text"),
    [
        ("project", "vision"),
        ("project", "训练llama"),  # Han with Latin
        ("project", "日本語のプロジェクト"),  # Han, Hiragana, Katakana
        ("project", "한국어 프로젝트 NLP"),  # Hangul with Latin
        ("project", "проект"),  # Cyrillic alone
        ("project", "ελληνικά"),  # Greek alone
        ("project", "café-ünïcode"),
        ("project", "Tiếng Việt"),  # stacked diacritics, precomposed
        ("project", "Tie\u0302\u0301ng Vie\u0323\u0302t"),  # the same decomposed
        ("project", "ｖｉｓｉｏｎ"),  # full-width Latin is Latin
        ("purpose", "проект test, αβ-sweep"),  # mixing is a name rule only
        ("purpose", "a\u0301\u0302\u0303\u0304 four marks"),
    ],
)
def test_names_in_one_script_or_the_usual_pairs_pass(field: str, text: str) -> None:
    assert check_description(field, text) == text


@pytest.mark.parametrize(
    ("a", "b"),
    [("Vision", "vision"), ("ｖｉｓｉｏｎ", "VISION"), (" nlp ", "NLP"), ("Straße", "STRASSE")],
)
def test_name_key_makes_case_and_width_one(a: str, b: str) -> None:
    assert descriptions.name_key(a) == descriptions.name_key(b)
    assert descriptions.name_key("v\u0456sion") != descriptions.name_key("vision")
    assert descriptions.name_key("v\u0131sion") == "vision"  # dotless ı passes for i
