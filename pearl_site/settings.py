"""Settings from the environment (12-factor).

DATABASE_URL  default: SQLite in WAL mode under ./var/ ; postgres://... for production
REDIS_URL     default: redis://127.0.0.1:6390 (the launcher's own Redis)
SECRET_KEY    from the environment; else generated once into $PEARL_VAR_DIR/secret_key (mode 0600)
DEBUG         off unless set (`manage.py launch --debug` sets it for development)
ALLOWED_HOSTS comma-separated; default localhost names
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("PEARL_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


TESTING = env_bool("PEARL_TESTING") or "pytest" in sys.modules
DEBUG = env_bool("DEBUG", False)


def _secret_key() -> str:
    """SECRET_KEY from the environment, else one generated into the var directory on first use, so that
    every manage.py command works without DEBUG and every process of one checkout signs alike."""
    key = os.environ.get("SECRET_KEY", "")
    if key:
        return key
    path = VAR_DIR / "secret_key"
    if not path.exists():
        import secrets
        import tempfile

        fd, tmp = tempfile.mkstemp(dir=VAR_DIR, prefix=".secret_key.")  # created 0600
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(50))
        try:
            os.link(tmp, path)  # atomic: concurrent first starts all end up with one key
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    return path.read_text().strip()


SECRET_KEY = _secret_key()

ALLOWED_HOSTS = [
    h.strip() for h in os.environ.get("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",") if h.strip()
]
CSRF_TRUSTED_ORIGINS = [o.strip() for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI / Redoc assets, served locally
    "channels",
    "django_celery_beat",
    "controlplane",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",  # static assets in every mode (no CDN, no separate server)
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "pearl_site.urls"
ASGI_APPLICATION = "pearl_site.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "frontend" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# ---------------------------------------------------------------- database
_DATABASE_URL = os.environ.get("DATABASE_URL", f"sqlite:///{VAR_DIR / 'pearl.sqlite3'}")
# Persistent PostgreSQL connections: opening one per hop to Daphne's database thread was 6.8 % of its CPU at
# 512 agents (BENCHMARKS.md, issue 22). The health check replaces a connection the server dropped before its
# next use. Off in tests, whose database is dropped at the end while other threads could still hold one.
_PERSISTENT_DB_S = 0 if TESTING or _DATABASE_URL.startswith("sqlite") else 60
DATABASES = {
    "default": dj_database_url.parse(
        _DATABASE_URL,
        conn_max_age=int(os.environ.get("PEARL_DB_CONN_MAX_AGE", _PERSISTENT_DB_S)),
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets the web server, Celery and beat read while one writes; IMMEDIATE avoids upgrade deadlocks.
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=10000;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
    }
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test_pearl.sqlite3")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
if TESTING:
    PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"


def _plotly_js_dir() -> Path:
    """plotly.min.js as the installed `plotly` package ships it, served at /static/plotly/ (no CDN, no copy)."""
    import plotly

    return Path(plotly.__file__).resolve().parent / "package_data"


STATICFILES_DIRS = [BASE_DIR / "frontend" / "static", ("plotly", _plotly_js_dir())]
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)
WHITENOISE_USE_FINDERS = True  # serve straight from frontend/static without a collectstatic step
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"

# Bad input gets a 4xx: cap bodies (ASGI Content-Length handling is fixed in Django >= 5.2.13).
DATA_UPLOAD_MAX_MEMORY_SIZE = 256 * 1024
DATA_UPLOAD_MAX_NUMBER_FIELDS = 1000

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_SAMESITE = "Lax"
SESSION_COOKIE_SAMESITE = "Lax"
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
# Production behind TLS (`PEARL_HTTPS=1`; README "Production settings"): secure cookies, HTTPS redirect,
# HSTS. With these, `manage.py check --deploy --fail-level WARNING` is clean (a test holds it to that).
if not DEBUG and not TESTING and env_bool("PEARL_HTTPS", False):
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = True
    SECURE_HSTS_SECONDS = int(os.environ.get("PEARL_HSTS_SECONDS", str(365 * 24 * 3600)))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("PEARL_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("PEARL_HSTS_PRELOAD", True)
    if env_bool("PEARL_BEHIND_PROXY", False):  # a TLS-terminating proxy in front says so in X-Forwarded-Proto
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# ---------------------------------------------------------------- Redis, Channels, Celery
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6390")
CHANNEL_LAYER_BACKEND = os.environ.get("PEARL_CHANNEL_LAYER", "redis")
if CHANNEL_LAYER_BACKEND == "memory":
    CHANNEL_LAYERS: dict[str, dict[str, Any]] = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
else:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # redis-py >= 8 defaults socket_timeout to 5 s, the same as channels-redis' blocking-pop
            # timeout, which kills idle sockets with "Timeout reading"; give the read more room.
            "CONFIG": {
                "hosts": [{"address": f"{REDIS_URL.rstrip('/')}/1", "socket_timeout": 30, "socket_connect_timeout": 5}],
                "capacity": 1000,
                "expiry": 30,
            },
        }
    }

CELERY_BROKER_URL = f"{REDIS_URL.rstrip('/')}/0"
CELERY_RESULT_BACKEND = f"{REDIS_URL.rstrip('/')}/0"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = False  # avoid message loops; tasks are idempotent and re-driven by beat
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_TIME_LIMIT = 300
CELERY_TASK_SOFT_TIME_LIMIT = 240
CELERY_RESULT_EXPIRES = 3600
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
CELERY_WORKER_SEND_TASK_EVENTS = True
CELERY_TASK_SEND_SENT_EVENT = True
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_TIMEZONE = "UTC"

# ---------------------------------------------------------------- REST API
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",  # first: anonymous API calls get 401 + WWW-Authenticate
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "controlplane.api.schema.PearlAutoSchema",
    "DEFAULT_PAGINATION_CLASS": "controlplane.api.params.StrictLimitOffsetPagination",
    "PAGE_SIZE": 100,
    "DEFAULT_PARSER_CLASSES": ["controlplane.api.parsers.BoundedJSONParser"],
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "EXCEPTION_HANDLER": "controlplane.api.errors.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "PEARL control plane API",
    "DESCRIPTION": "Elastic, PD-adaptive rollout scheduling for asynchronous agentic RL.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    "SCHEMA_PATH_PREFIX": "/api/",
    "COMPONENT_SPLIT_REQUEST": True,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {"RolloutModeEnum": [("colocated", "colocated"), ("disaggregated", "disaggregated")]},
}

# ---------------------------------------------------------------- PEARL
PEARL: dict[str, Any] = {  # numbers and rate strings: read by key where each is used
    "LEASE_S": float(os.environ.get("PEARL_LEASE_S", "15")),
    "HEARTBEAT_S": float(os.environ.get("PEARL_HEARTBEAT_S", "3")),
    "SWEEP_S": float(os.environ.get("PEARL_SWEEP_S", "5")),
    "REPLAN_S": float(os.environ.get("PEARL_REPLAN_S", "10")),
    # off: no new decision or transition for any job, on any signal (an operator's stop for an incident or
    # maintenance: one already planned runs to its end, workers keep serving as placed; leases, sweeps, allotments
    # and Training Begin's returns go on)
    "PLANNER": env_bool("PEARL_PLANNER", True),
    # the cluster arbiter lends a job's idle training GPUs to other jobs' rollout until its next Training Begin
    # (services.lending); off: each job's training GPUs serve only its own rollout
    "CROSS_JOB_LENDING": env_bool("PEARL_CROSS_JOB_LENDING", True),
    "MAX_JSON_DEPTH": 16,
    # weights tokens rotate every period (a leaked one opens one job's weights for <= 3 periods)
    "WEIGHTS_TOKEN_ROTATE_S": float(os.environ.get("PEARL_WEIGHTS_TOKEN_ROTATE_S", "300")),
    # per-user limit on state-changing API calls (jobs, overrides, drains, preemptions); per process
    "WRITE_RATE": os.environ.get("PEARL_WRITE_RATE", "120/min"),
    # a transition step the agents have not shown done in this long is issued again (then fails)
    "STEP_TIMEOUT_S": float(os.environ.get("PEARL_STEP_TIMEOUT_S", "120")),
    # ... for a vLLM job's steps: a vLLM engine may take minutes to start (the agent waits up to
    # PEARL_VLLM_START_TIMEOUT_S, 600 s, for it); longer than that, so the agent's report of a failed start comes first
    "VLLM_STEP_TIMEOUT_S": float(os.environ.get("PEARL_VLLM_STEP_TIMEOUT_S", "660")),
    # borrowed workers must be back this long after Training Begin (the return deadline)
    "RETURN_DEADLINE_S": float(os.environ.get("PEARL_RETURN_DEADLINE_S", "30")),
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {"daphne": {"level": "WARNING"}, "django.channels.server": {"level": "WARNING"}},
}
