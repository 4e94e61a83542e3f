"""What every `pycni` command on the store shares (ipam, node, svc): store options, output,
and the one error exit.

``command_options`` adds ``--config``, ``--etcd-endpoints``, ``--store-path``, ``--etcd-ca``,
``--etcd-cert``, ``--etcd-key``, ``--etcd-username``, ``--etcd-password-file`` and ``--output``
to a command and hands it an ``Env``. Any
``CNIError`` (bad input, store unreachable, conflicts) becomes one message on stderr and exit
status 1, naming the store when the store is the problem; never a traceback.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import click

from cli.open_store import (
    StoreOptions,
    calc_store_config,
    describe_store,
    load_config,
    open_configured,
)
from cni.spec.errors import CNIError, InvalidConfig, NotAvailable, TryAgainLater
from kube.config import KubeConfig
from pycnid.config import DaemonConfig
from store.base import Store

if TYPE_CHECKING:
    pass

EXIT_ERROR = 1
EXIT_PROBLEMS = 2


class Failed(InvalidConfig):
    """A usage problem found by the command itself."""


@dataclass
class Env:
    opts: StoreOptions
    output: str = "table"
    _store: Store | None = field(default=None, repr=False)
    _config: DaemonConfig | None = field(default=None, repr=False)
    store_name: str = ""

    def store(self) -> Store:
        if self._store is None:
            store_config = calc_store_config(self.opts, self.config())
            self.store_name = describe_store(store_config)
            self._store = open_configured(store_config)
        return self._store

    def config(self) -> DaemonConfig:
        if self._config is None:
            self._config = load_config(self.opts)
        return self._config

    def kube(self) -> KubeConfig | None:
        """The ``kubernetes`` section of pycnid's config: Services come from the API server
        (its sections are parsed for this, as pycnid parses them)."""
        return load_config(self.opts, sections=True).kube

    def emit(self, doc: dict, render: Callable[[dict], str]) -> None:
        if self.output == "json":
            click.echo(json.dumps(doc, indent=2, sort_keys=True))
        elif self.output == "yaml":
            import yaml

            click.echo(yaml.safe_dump(doc, sort_keys=False), nl=False)
        else:
            click.echo(render(doc))

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


def command_prefix() -> str:
    """The running command's group ("pycni ipam", "pycni node" …), to start its messages."""
    ctx, names = click.get_current_context(silent=True), []
    while ctx is not None:
        names.append(ctx.info_name)
        ctx = ctx.parent
    return f"pycni {names[-2]}" if len(names) >= 2 else "pycni"


def describe_error(exc: CNIError, env: Env) -> str:
    text = f"{command_prefix()}: {exc.msg}"
    if (
        isinstance(exc, (TryAgainLater, NotAvailable))
        and env.store_name
        and env.store_name.split(":", 1)[1] not in str(exc)
    ):
        text += f" (store {env.store_name})"
    return text + (f"\n  {exc.details}" if exc.details else "")


def run(env: Env, body: Callable[[], Any]) -> None:
    """Run a command body; its int result is the exit status."""
    try:
        code = body() or 0
    except CNIError as exc:
        click.echo(describe_error(exc, env), err=True)
        code = EXIT_ERROR
    except KeyboardInterrupt:
        code = 130
    except (click.exceptions.Exit, click.ClickException):
        raise
    except Exception as exc:  # a bug: still one readable line, never a traceback
        click.echo(f"{command_prefix()}: internal error: {type(exc).__name__}: {exc}", err=True)
        code = EXIT_ERROR
    finally:
        env.close()
    if code:
        sys.exit(code)


def command_options(
    fn: Callable[..., Any] | None = None, *, outputs: tuple[str, ...] = ("table", "json")
) -> Any:
    """The store options and ``--output`` (``outputs``: its choices; ``yaml`` prints the
    JSON document as YAML)."""
    if fn is None:
        return functools.partial(command_options, outputs=outputs)

    @click.option(
        "--config",
        "config_path",
        envvar="PYCNI_CONFIG",
        default=None,
        metavar="FILE",
        help="pycnid's config, for its store [default: /etc/pycni/pycnid.json]",
    )
    @click.option(
        "--etcd-endpoints",
        envvar="PYCNI_ETCD_ENDPOINTS",
        default=None,
        metavar="URLS",
        help="etcd endpoints (comma-separated), instead of the config's store",
    )
    @click.option(
        "--store-path",
        envvar="PYCNI_STORE_PATH",
        default=None,
        metavar="FILE",
        help="a SQLite store file, instead of the config's store",
    )
    @click.option("--etcd-ca", default=None, metavar="FILE", help="etcd CA certificate")
    @click.option("--etcd-cert", default=None, metavar="FILE", help="etcd client certificate")
    @click.option("--etcd-key", default=None, metavar="FILE", help="etcd client key")
    @click.option("--etcd-username", default=None, metavar="NAME", help="etcd user")
    @click.option(
        "--etcd-password-file",
        default=None,
        metavar="FILE",
        help="the etcd user's password, in a file only its owner may read",
    )
    @click.option(
        "--output",
        "-o",
        type=click.Choice(list(outputs)),
        default="table",
        show_default=True,
        help=f"{'/'.join(outputs[1:])}: one stable document on stdout",
    )
    @functools.wraps(fn)
    def wrapper(
        config_path: str | None,
        etcd_endpoints: str | None,
        store_path: str | None,
        etcd_ca: str | None,
        etcd_cert: str | None,
        etcd_key: str | None,
        etcd_username: str | None,
        etcd_password_file: str | None,
        output: str,
        **kwargs: Any,
    ) -> None:
        env = Env(
            StoreOptions(
                config_path,
                etcd_endpoints,
                store_path,
                etcd_ca,
                etcd_cert,
                etcd_key,
                etcd_username,
                etcd_password_file,
            ),
            output,
        )
        run(env, lambda: fn(env, **kwargs))

    return wrapper
