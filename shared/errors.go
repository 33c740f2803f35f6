package shared

import "errors"

// Errors a Provisioner method may return, carried across the wire as gRPC
// status codes and turned back into these on the other side, so callers
// can test them with errors.Is wherever the provisioner runs.
var (
	// ErrPluginGone means the plugin process has exited or its connection
	// broke. Calls return it promptly instead of hanging; the host's
	// supervisor decides whether to start another.
	ErrPluginGone = errors.New("provisioner plugin is gone")

	// ErrNotConfigured means a method that needs a configuration was
	// called before Configure succeeded.
	ErrNotConfigured = errors.New("provisioner is not configured")

	// ErrShutdown means Shutdown has been called; the provisioner asks for
	// nothing more.
	ErrShutdown = errors.New("provisioner is shut down")

	// ErrPermissionDenied means the host refused a plugin's request, such
	// as a credential for a worker that is not the plugin's.
	ErrPermissionDenied = errors.New("permission denied")

	// ErrInvalidArgument means a request was malformed.
	ErrInvalidArgument = errors.New("invalid argument")

	// ErrUnimplemented means the other side does not implement the
	// method: an older plugin, or one in another language that chose not
	// to.
	ErrUnimplemented = errors.New("not implemented by this plugin")

	// ErrNoHost means the plugin was not given a Host: it was configured
	// without the host channel, so it can neither publish nor mint.
	ErrNoHost = errors.New("no host channel")

	// ErrChecksumMismatch means a plugin binary's SHA-256 differs from the
	// pin in the configuration; it was not started.
	ErrChecksumMismatch = errors.New("plugin binary does not match its sha256 pin")

	// ErrIncompatible means the plugin and the host speak different
	// versions of the protocol.
	ErrIncompatible = errors.New("plugin and host protocol versions differ")
)
