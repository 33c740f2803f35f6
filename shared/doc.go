// Package shared is the Provisioner contract: the interface, its request
// and response types, shapes, the configuration schema, diagnostics and
// the errors both sides share. It imports no gRPC, no go-plugin and no
// HCL (`make check-plugin-deps` keeps it so), because everybody reads it:
// plugin authors, engine authors, and the two SDKs.
//
// The rooms, one per audience. What both sides link is under shared/:
//
//	shared             the contract (this package)
//	shared/proto       the wire contract, normative: provisioner.proto
//	shared/plugin      what a plugin's main needs: Serve
//	shared/conformance the kit a plugin's tests run
//	shared/sharedtest  one fake provisioner and one fake host, for tests only
//
// What only an engine links is under engine/, and a plugin never links it
// (make check-plugin-deps):
//
//	engine             the engine kit: Engine, its fleet, router, books and events
//	engine/host        the plugin host: Launch, LaunchBlock, the credential guard
//	engine/hclconfig   configuration decoding, HCL to the plugin's JSON
//
// The worker, which runs on compute nodes, is worker/ and links nothing of
// the engine; the wire both SDKs speak (generated protobuf and the gRPC
// adapters) is the module's internal/pb and internal/wire.
//
// A provisioner is somewhere machines can be asked for. An engine does not
// link one in: it starts each configured kind as its own executable and
// talks to it over gRPC, through HashiCorp's go-plugin. So a site can add
// a staged Slurm, a cloud, or something nobody here has heard of without
// rebuilding the engine, a plugin that panics takes only itself down, and
// a plugin can be written in any language that has gRPC: the protocol is
// written down in docs/plugin-protocol.md, bin/provisioner-conformance
// checks a plugin against it, and examples/python-local is a plugin in
// Python. The price is a process and a socket per provisioner and a few
// hundred microseconds a call; the router's hot path (does anything cover
// this node?) is answered from shapes the engine caches, so it never pays
// it.
//
// The contract is small on purpose. Asking is not scheduling: the engine's
// router decides what runs where, and a provisioner only says what sizes it
// can start, starts one when asked, and forgets or gives up on what it
// asked for. Every method takes a context and a request struct and returns
// a response struct and an error, so that fields can be added to either
// without breaking anybody; a "no" (nothing fits, one is already asked
// for) is an answer, not an error. The wire contract is proto/
// provisioner.proto; its generated types stay in internal/pb, and small
// converters keep them out of everybody's code, so the domain types here
// can be read and changed without knowing protobuf.
//
// Configuration belongs to the plugin but is parsed by the host. The host
// reads HCL, keeps its own few meta-arguments (which binary, its pin), and
// decodes the rest of the block against the schema the plugin declares;
// the plugin receives plain JSON and answers with diagnostics that carry a
// path into it, which the host turns back into file:line:col. A plugin
// never needs an HCL parser, and an operator sees every mistake where it
// was made. The decoding lives in engine/hclconfig, so that neither this
// package nor a plugin links HCL (`make check-plugin-deps`).
//
// The plugin talks back over one stream the host opens (HostChannel):
// events, in order and acknowledged, and requests for worker credentials.
// The host keeps the signing secret and mints only for workers named after
// the asking provisioner, for no longer than its cap; a plugin never holds
// the key. go-plugin's broker would have carried the same for Go plugins
// only, so it is not used.
//
// Failure is part of the contract. Errors cross as gRPC codes and come
// back as the sentinels in errors.go, so errors.Is works on both sides.
// A call to a plugin whose process has died returns ErrPluginGone at once
// rather than hanging, and Plugin.ExitStatus says how it died and what it
// last wrote. A plugin whose host dies, or that gets SIGTERM, shuts its
// provisioner down within seconds and exits, so plugins do not outlive
// their engine.
//
// What it will not do: restart a plugin that died (that is the engine's
// supervisor's decision), retry calls, or decide what to provision. It
// holds types and rules, not processes: nothing here starts, dials or
// parses anything.
package shared
