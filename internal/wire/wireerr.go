package wire

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fluksio/provision/shared"
)

// errorDomain tags the ErrorInfo detail that names one of our sentinels, so
// a reason from some other library's error is never mistaken for ours.
const errorDomain = "provision.fluksio"

// wireErrors lists the sentinels that cross the wire: the gRPC code a
// plugin in any language can set, and the reason that makes it exact.
var wireErrors = []struct {
	err    error
	code   codes.Code
	reason string
}{
	{shared.ErrNotConfigured, codes.FailedPrecondition, "NOT_CONFIGURED"},
	{shared.ErrShutdown, codes.FailedPrecondition, "SHUT_DOWN"},
	{shared.ErrNoHost, codes.FailedPrecondition, "NO_HOST"},
	{shared.ErrPermissionDenied, codes.PermissionDenied, "PERMISSION_DENIED"},
	{shared.ErrInvalidArgument, codes.InvalidArgument, "INVALID_ARGUMENT"},
	{shared.ErrUnimplemented, codes.Unimplemented, "UNIMPLEMENTED"},
}

// toStatus turns an error from a Provisioner into a gRPC status error. The
// message keeps the whole error text, so nothing the implementation said
// is lost on the way.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	for _, w := range wireErrors {
		if errors.Is(err, w.err) {
			st := status.New(w.code, err.Error())
			if withInfo, derr := st.WithDetails(&errdetails.ErrorInfo{Domain: errorDomain, Reason: w.reason}); derr == nil {
				st = withInfo
			}
			return st.Err()
		}
	}
	return status.Error(codes.Unknown, err.Error())
}

// fromStatus turns a gRPC error back into one that errors.Is can match
// against our sentinels and the context errors. gone reports whether the
// plugin process has exited, which turns a broken connection into
// ErrPluginGone rather than a transport message nobody can act on.
func fromStatus(err error, gone bool) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		if gone {
			return fmt.Errorf("%w: %v", shared.ErrPluginGone, err)
		}
		return err
	}
	msg := st.Message()
	for _, d := range st.Details() {
		info, ok := d.(*errdetails.ErrorInfo)
		if !ok || info.GetDomain() != errorDomain {
			continue
		}
		for _, w := range wireErrors {
			if w.reason == info.GetReason() {
				return &remoteError{sentinel: w.err, msg: msg, reason: w.reason}
			}
		}
	}
	switch st.Code() {
	case codes.Unavailable:
		return fmt.Errorf("%w: %s", shared.ErrPluginGone, msg)
	case codes.Canceled:
		if gone {
			return fmt.Errorf("%w: %s", shared.ErrPluginGone, msg)
		}
		return &remoteError{sentinel: context.Canceled, msg: msg}
	case codes.DeadlineExceeded:
		return &remoteError{sentinel: context.DeadlineExceeded, msg: msg}
	case codes.FailedPrecondition:
		return &remoteError{sentinel: shared.ErrNotConfigured, msg: msg}
	}
	for _, w := range wireErrors {
		if w.code == st.Code() && w.code != codes.FailedPrecondition {
			return &remoteError{sentinel: w.err, msg: msg}
		}
	}
	return &remoteError{msg: msg}
}

// remoteError is an error that came over the wire: the other side's text,
// which usually already names the sentinel, and the sentinel for errors.Is.
type remoteError struct {
	sentinel error
	msg      string
	// reason is the ErrorInfo reason the other side sent, empty when it
	// sent a bare code and the sentinel was guessed from it.
	reason string
}

// ErrorReason is the reason of the ErrorInfo detail (domain
// provision.fluksio) an error from the other side carried, such as
// "SHUT_DOWN"; empty when it carried none. A bare FAILED_PRECONDITION is
// read as ErrNotConfigured, so only the reason says the plugin meant it;
// the conformance checker asks.
func ErrorReason(err error) string {
	var re *remoteError
	if errors.As(err, &re) {
		return re.reason
	}
	return ""
}

func (e *remoteError) Error() string {
	if e.sentinel != nil && e.msg == "" {
		return e.sentinel.Error()
	}
	return e.msg
}

func (e *remoteError) Unwrap() error { return e.sentinel }
