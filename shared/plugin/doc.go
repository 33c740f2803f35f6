// Package plugin is what a provisioner plugin's main needs, and nothing
// of the host: Serve answers go-plugin's handshake, serves the contract
// over gRPC, logs JSON lines on stderr for the host to read, and shuts the
// provisioner down when its host dies or it is told to stop.
//
// A plugin never parses HCL and never holds the engine's secret: it
// declares a schema and receives JSON, and asks the host for credentials.
// So this package links neither HCL nor anything of the host
// (`make check-plugin-deps`).
package plugin
