// Package relay is the relay daemon: the Slurm plugin's own binary, run on
// a login node as "provisioner-slurm relay", for sites whose compute nodes
// cannot reach the engine (reach = "relay"). It listens where the nodes
// can reach it and carries each connection as a yamux stream over its
// standard input and output, which is the ssh session the plugin holds.
//
// It owns what runs on the login node and the few facts both ends must
// agree on: the greeting line (Greeting), the certificate line (Cert,
// NewCert), the session's yamux settings (YamuxConfig), the exit code of
// a taken port (ExitPortTaken) and the private copy's name (PrivateName).
// It dials nothing: where a stream goes is the plugin's business (package
// slurm's relay session), and the plugin sends each to the engine alone.
// It imports nothing of the module, so that what runs on a site's login
// node is small and reads in one sitting.
package relay
