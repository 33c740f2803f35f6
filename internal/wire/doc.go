// Package wire carries the contract over gRPC: the client a host calls, the
// server a plugin runs, the converters between the domain types of package
// shared and the generated ones of pb, errors as gRPC codes and back, the
// host channel (events and credential requests), and the go-plugin
// handshake. It is internal so that proto types never leak: host and
// plugin code see only package shared's types, as terraform-plugin-go
// keeps tfprotov6 apart from its wire.
//
// It decides nothing: no policy on names, lifetimes or restarts (that is
// the host's), only faithful transport, bounded (limits.go).
//
// Design records: docs/design/wire-event-queue.md.
package wire
