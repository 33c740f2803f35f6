"""The protocol plumbing of a provisioner plugin in Python.

Everything here is docs/plugin-protocol.md in code, and nothing of it is
about any one kind of provisioner: the magic cookie, the handshake line,
go-plugin's automatic mutual TLS, the health and controller services,
JSON log lines on stderr, errors with their ErrorInfo detail, the host
channel (events and credentials), and the duties on SIGTERM and on the
host's death. A plugin's own logic (provisioner-local beside this file)
is a class with one method per RPC, taking and returning the generated
messages of shared/proto/provisioner.proto; serve() does the rest.

Only Debian 12's python3-grpcio, python3-protobuf and python3-cryptography
are needed. The stubs in gen/ come from `make python-proto`.
"""

import base64
import datetime
import json
import logging
import os
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time
from concurrent import futures

# gRPC's C core writes its own lines to stderr, which are not log lines
# the host parses; keep it to errors.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gen"))

import grpc  # noqa: E402
from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: E402

import controller_pb2  # noqa: E402
import controller_pb2_grpc  # noqa: E402
import health_pb2  # noqa: E402
import health_pb2_grpc  # noqa: E402
import provisioner_pb2 as pb  # noqa: E402,F401  (re-exported for plugins)
import provisioner_pb2_grpc  # noqa: E402
import rpc_status_pb2  # noqa: E402

COOKIE_KEY = "FLUKSIO_PROVISIONER_PLUGIN"
COOKIE_VALUE = "b5f1c3a2-provisioner"
PROTOCOL_VERSION = 2
CONTRACT_VERSION = "2.5"
# Capabilities (contract 2.5): a plugin lists those it offers in
# InfoResponse.capabilities; a host lists its own in Hello.capabilities.
CAPABILITY_RECONCILE_DELTA = "reconcile_delta"  # the plugin takes Reconcile by change
CAPABILITY_BATCH_MINT = "batch_mint"            # the host answers MintCredentials
LOG_LEVEL_ENV = "FLUKSIO_PLUGIN_LOG_LEVEL"
ERROR_DOMAIN = "provision.fluksio"

# How long the plugin's own Shutdown may take when SIGTERM arrives or the
# host dies, and how often the host's life is checked.
ORPHAN_SHUTDOWN_SECONDS = 2.5
PARENT_POLL_SECONDS = 0.5


# -- errors ------------------------------------------------------------------

class PluginError(Exception):
    """An error that crosses to the host as a gRPC code and a reason."""
    code = grpc.StatusCode.UNKNOWN
    reason = ""


class NotConfigured(PluginError):
    code, reason = grpc.StatusCode.FAILED_PRECONDITION, "NOT_CONFIGURED"


class ShutDown(PluginError):
    code, reason = grpc.StatusCode.FAILED_PRECONDITION, "SHUT_DOWN"


class NoHost(PluginError):
    code, reason = grpc.StatusCode.FAILED_PRECONDITION, "NO_HOST"


class InvalidArgument(PluginError):
    code, reason = grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"


class PermissionDenied(PluginError):
    code, reason = grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED"


def _abort(context, err):
    """Ends the call with err's code and a google.rpc.ErrorInfo detail in
    grpc-status-details-bin, as gRPC's status packages do."""
    message = str(err) or err.reason.lower().replace("_", " ")
    info = rpc_status_pb2.ErrorInfo(reason=err.reason, domain=ERROR_DOMAIN)
    st = rpc_status_pb2.Status(code=err.code.value[0], message=message)
    st.details.add(type_url="type.googleapis.com/google.rpc.ErrorInfo", value=info.SerializeToString())
    context.set_trailing_metadata((("grpc-status-details-bin", st.SerializeToString()),))
    context.abort(err.code, message)


# -- logging -----------------------------------------------------------------

_LEVELS = {"trace": 5, "debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "error": logging.ERROR}


class _JSONLines(logging.Handler):
    """One JSON object a line on stderr, as hclog writes them, so the host
    shows each under the provisioner's name at its level."""

    def emit(self, record):
        level = "error"
        for name, number in sorted(_LEVELS.items(), key=lambda kv: kv[1]):
            if record.levelno >= number:
                level = name
        now = datetime.datetime.now(datetime.timezone.utc)
        line = {"@level": level, "@message": record.getMessage(), "@module": record.name,
                "@timestamp": now.strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z"}
        line.update(getattr(record, "fields", {}))
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        try:
            sys.stderr.write(json.dumps(line, default=str) + "\n")
            sys.stderr.flush()
        except (BrokenPipeError, OSError):
            pass  # the host is gone; the parent watch will notice


class Logger:
    """log.info("message", key=value, ...): hclog's shape."""

    def __init__(self, name):
        self._log = logging.getLogger(name)

    def _at(self, level, msg, fields):
        self._log.log(level, msg, extra={"fields": fields})

    def debug(self, msg, **fields): self._at(logging.DEBUG, msg, fields)
    def info(self, msg, **fields): self._at(logging.INFO, msg, fields)
    def warn(self, msg, **fields): self._at(logging.WARNING, msg, fields)
    def error(self, msg, **fields): self._at(logging.ERROR, msg, fields)


def _setup_logging():
    logging.addLevelName(5, "TRACE")
    root = logging.getLogger()
    root.handlers[:] = [_JSONLines()]
    root.setLevel(_LEVELS.get(os.environ.get(LOG_LEVEL_ENV, "").lower(), logging.INFO))


# -- the host channel ----------------------------------------------------------

class Host:
    """The plugin's end of HostChannel: publish events, mint credentials.
    Both wait for the host's answer, up to timeout seconds."""

    def __init__(self):
        self._lock = threading.Lock()  # guards everything below
        self._out = None               # queue of PluginMessage, while a stream is open
        self._seq = 0
        self._next_id = 0
        self._waiting = {}             # ("ack", seq) or ("cred", id) -> [threading.Event, answer]

    def publish(self, kind, profile="", job="", worker="", detail="", failure_class="", timeout=10):
        with self._lock:
            if self._out is None:
                raise NoHost("no host channel: cannot publish " + kind)
            self._seq += 1
            seq = self._seq
            waiter = self._waiting[("ack", seq)] = [threading.Event(), None]
            self._out.put(pb.PluginMessage(event=pb.Event(
                seq=seq, kind=kind, profile=profile, job=job, worker=worker, detail=detail,
                failure_class=failure_class, time_unix_nano=time.time_ns())))
        self._wait(("ack", seq), waiter, timeout)

    def mint_credential(self, worker, ttl_seconds, cpus, gpus=0, ram_mb=0, labels=(), timeout=10):
        """Returns (token, expires_unix_nano); raises PermissionDenied or
        InvalidArgument when the host refuses."""
        with self._lock:
            if self._out is None:
                raise NoHost("no host channel: cannot mint a credential")
            self._next_id += 1
            rid = self._next_id
            waiter = self._waiting[("cred", rid)] = [threading.Event(), None]
            self._out.put(pb.PluginMessage(mint_credential=pb.MintCredential(
                request_id=rid, worker=worker, ttl_seconds=ttl_seconds, cpus=cpus, gpus=gpus,
                ram_mb=ram_mb, labels=list(labels))))
        cred = self._wait(("cred", rid), waiter, timeout)
        if cred.error_code:
            err = {grpc.StatusCode.PERMISSION_DENIED.value[0]: PermissionDenied,
                   grpc.StatusCode.INVALID_ARGUMENT.value[0]: InvalidArgument}.get(cred.error_code, PluginError)
            raise err(cred.error_message)
        return cred.token, cred.expires_unix_nano

    def _wait(self, key, waiter, timeout):
        ok = waiter[0].wait(timeout)
        with self._lock:
            self._waiting.pop(key, None)
        if not ok or waiter[1] is None:
            raise NoHost("the host did not answer")
        return waiter[1]

    def _answer(self, key, answer):
        with self._lock:
            waiter = self._waiting.get(key)
        if waiter:
            waiter[1] = answer
            waiter[0].set()

    def serve(self, requests, context):
        """The HostChannel RPC: Hello in, Ready out, then events and
        credential requests out and their answers in, until the host
        closes the stream."""
        first = next(requests, None)
        if first is None or not first.HasField("hello"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the host channel must start with Hello")
        out = queue.Queue()
        with self._lock:
            self._out = out

        def read():
            try:
                for msg in requests:
                    if msg.HasField("event_ack"):
                        self._answer(("ack", msg.event_ack.seq), msg.event_ack)
                    elif msg.HasField("credential"):
                        self._answer(("cred", msg.credential.request_id), msg.credential)
            except grpc.RpcError:
                pass
            out.put(None)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        yield pb.PluginMessage(ready=pb.Ready())
        try:
            while context.is_active():
                try:
                    msg = out.get(timeout=0.5)
                except queue.Empty:
                    continue
                if msg is None:
                    break
                yield msg
        finally:
            with self._lock:
                if self._out is out:
                    self._out = None
                # Whoever waits on this stream will hear nothing more.
                for waiter in self._waiting.values():
                    waiter[0].set()


# -- the services --------------------------------------------------------------

_RPCS = ["Info", "Schema", "ValidateConfig", "Configure", "Shapes",
         "Provision", "Reconcile", "Status", "Shutdown"]


class _Provisioner(provisioner_pb2_grpc.ProvisionerServicer):
    """Calls the plugin's method for each RPC (Info -> info, ValidateConfig
    -> validate_config), and turns a PluginError into its status."""

    def __init__(self, impl, host, log):
        self._impl, self._host, self._log = impl, host, log

    def HostChannel(self, request_iterator, context):
        return self._host.serve(request_iterator, context)

    # Contract 2.2's optional RPCs: answered by the plugin's check and
    # preview methods if it has them, else UNIMPLEMENTED, which a host
    # reads as "this kind offers none". Said explicitly: the generated
    # base class's NotImplementedError left the call unanswered (grpcio
    # 1.51), and the host waited out its deadline.
    def Check(self, request, context):
        return self._optional("Check", request, context)

    def Preview(self, request, context):
        return self._optional("Preview", request, context)

    # Deprecated since contract 2.5 (no host calls it): answered by the
    # plugin's covers method if it has one, else UNIMPLEMENTED.
    def Covers(self, request, context):
        return self._optional("Covers", request, context)

    def _optional(self, rpc, request, context):
        if not hasattr(self._impl, rpc.lower()):
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "%s is not offered by this plugin" % rpc)
        return _method(rpc)(self, request, context)


def _method(rpc):
    name = "".join("_" + c.lower() if c.isupper() else c for c in rpc).lstrip("_")

    def call(self, request, context):
        try:
            return getattr(self._impl, name)(request)
        except PluginError as err:
            _abort(context, err)
        except Exception as err:  # a bug: say so, and keep serving
            self._log.error("%s failed" % rpc, error=repr(err))
            context.abort(grpc.StatusCode.INTERNAL, "%s: %r" % (rpc, err))
    return call


for _rpc in _RPCS:
    setattr(_Provisioner, _rpc, _method(_rpc))


class _Health(health_pb2_grpc.HealthServicer):
    def Check(self, request, context):
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


class _Controller(controller_pb2_grpc.GRPCControllerServicer):
    def __init__(self, stop):
        self._stop = stop

    def Shutdown(self, request, context):
        self._stop.set()
        return controller_pb2.Empty()


def _server_credentials():
    """go-plugin's AutoMTLS: the host's certificate arrives in
    PLUGIN_CLIENT_CERT (PEM); the plugin makes its own, requires the
    host's for every connection, and returns its own in the handshake's
    sixth field (DER, base64 without padding). None when the host sent no
    certificate."""
    client_pem = os.environ.get("PLUGIN_CLIENT_CERT", "")
    if not client_pem:
        return None, ""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(seconds=30)).not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=True, key_agreement=True,
                                         key_cert_sign=True, content_commitment=False, data_encipherment=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    creds = grpc.ssl_server_credentials([(key_pem, cert.public_bytes(serialization.Encoding.PEM))],
                                        root_certificates=client_pem.encode(), require_client_auth=True)
    der = cert.public_bytes(serialization.Encoding.DER)
    return creds, base64.b64encode(der).decode().rstrip("=")


_USAGE = """%(prog)s is a provisioner plugin (kind "%(kind)s", plugin version %(version)s, contract %(contract)s).

An engine runs it, not a person: the engine launches it and speaks the
Provisioner contract to it over gRPC (HashiCorp go-plugin). To use it,
name it in a provisioner block of the engine's configuration,

  provisioner "%(kind)s" "NAME" {
    plugin = "/path/to/%(prog)s"
    ...
  }

and check that configuration with "host-example validate [-check] FILE".

usage:
  %(prog)s --version   print the version
  %(prog)s --help      print this
"""


def _by_hand(kind, version):
    """The plugin run by a person (no cookie): --version and --help answer
    on stdout with exit 0, as docs/plugin-protocol.md section 1 asks;
    anything else says what this is on stderr and exits 1 (2 for an
    unknown argument)."""
    prog = os.path.basename(sys.argv[0])
    usage = _USAGE % {"prog": prog, "kind": kind, "version": version, "contract": CONTRACT_VERSION}
    args = sys.argv[1:]
    if args[:1] in (["--version"], ["-version"], ["version"]):
        sys.stdout.write("%s (kind %s, plugin %s, contract %s)\n" % (prog, kind, version, CONTRACT_VERSION))
        return 0
    if args[:1] in (["--help"], ["-help"], ["-h"], ["help"]):
        sys.stdout.write(usage)
        return 0
    if args:
        sys.stderr.write("%s: unknown argument %r\n\n%s" % (prog, args[0], usage))
        return 2
    sys.stderr.write(usage)
    return 1


def serve(factory, kind="", version=""):
    """Runs a plugin: factory(log, host) returns the object whose methods
    answer the RPCs; kind and version are what --version says. Returns
    never; the process exits when the host is done with it, on SIGTERM, or
    when the host dies."""
    if os.environ.get(COOKIE_KEY) != COOKIE_VALUE:
        sys.exit(_by_hand(kind, version))
    offered = [v for v in os.environ.get("PLUGIN_PROTOCOL_VERSIONS", "").split(",") if v]
    if offered and str(PROTOCOL_VERSION) not in offered:
        sys.stderr.write("the host offers protocol versions %s; this plugin speaks %d\n" % (offered, PROTOCOL_VERSION))
        sys.exit(1)
    _setup_logging()
    log = Logger("plugin")
    parent = os.getppid()
    host = Host()
    impl = factory(Logger("provisioner"), host)

    stop = threading.Event()   # the controller asked
    leave = []                 # why to shut down on our own, if anything
    signal.signal(signal.SIGTERM, lambda *_: leave.append("received SIGTERM"))
    # Ctrl-C in the host's terminal reaches the whole group; the host
    # stops its plugins itself then.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    provisioner_pb2_grpc.add_ProvisionerServicer_to_server(_Provisioner(impl, host, log), server)
    health_pb2_grpc.add_HealthServicer_to_server(_Health(), server)
    controller_pb2_grpc.add_GRPCControllerServicer_to_server(_Controller(stop), server)
    sockdir = tempfile.mkdtemp(prefix="plugin")
    sock = os.path.join(sockdir, "plugin.sock")
    creds, cert = _server_credentials()
    if creds:
        server.add_secure_port("unix:" + sock, creds)
    else:
        server.add_insecure_port("unix:" + sock)
    server.start()
    # The handshake, and the last thing this process writes to stdout.
    sys.stdout.write("1|%d|unix|%s|grpc|%s\n" % (PROTOCOL_VERSION, sock, cert))
    sys.stdout.flush()

    while not stop.wait(PARENT_POLL_SECONDS / 5):
        if not leave and os.getppid() != parent:
            leave.append("the host process is gone")
        if leave:
            log.warn("shutting down", reason=leave[0])
            try:
                impl.shutdown(pb.ShutdownRequest(deadline_unix_nano=time.time_ns() + int(ORPHAN_SHUTDOWN_SECONDS * 1e9)))
            except Exception as err:
                log.error("shutdown failed", error=repr(err))
            break
    server.stop(grace=0.2).wait(1)
    shutil.rmtree(sockdir, ignore_errors=True)
    sys.stderr.flush()
    os._exit(0)
