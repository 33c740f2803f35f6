// Package sshrun runs commands on a cluster's login nodes through the
// system ssh: the Slurm plugin's one way to the cluster.
//
// It is the system ssh, and no ssh library, so that whatever the user's
// ssh already does (keys, agents, jump hosts, an operator's ControlMaster
// opened with MFA) works here too. A Transport (New) holds one cluster's
// ssh settings (Config) and runs one command per call (Run, RunWithin,
// RunOn), or leaves one running with its streams open (Start, a Session:
// the relay's).
//
// It owns:
//   - ssh's argv: BatchMode, the multiplexing options, then the user's
//     options, then "--", the login and the remote command, each word
//     shell-quoted (the login node's shell reads it as one string);
//   - the ssh processes it starts, each with one owner that waits for it:
//     a call's is waited for before the call returns, a Session's by its
//     Close, the "ssh -O exit" to a master by Close or CleanStale. A
//     killed ssh may hold its output open for at most WaitDelay. Nothing
//     is left running: Close ends the Sessions still open and tells every
//     master it made to exit;
//   - multiplexing (OpenSSH's ControlMaster): one master connection per
//     login node, its socket in a private directory (/tmp/fxssh-<pid>-*,
//     mode 0700) removed at Close, and those of a process that died
//     removed by the next (CleanStale); a master ssh could not use, or
//     that a call ran out of time on, is retired, so that the next call
//     makes a new one;
//   - the connection slots: at most MaxSessions commands at once, to
//     stay below sshd's MaxSessions (10 by default) on a shared
//     connection;
//   - failing over between login nodes: one that does not answer is
//     skipped until its retry is due, and one that refuses the login (its
//     authentication, or its host key: Refused) is left alone until its
//     slow retry is due, a minute doubling to 15, tried by one command at
//     a time, every other failing at once with ErrLoginRefused, so that
//     no sshd penalty or fail2ban rule is tripped; how each stands is
//     Notes, the way in as a whole Access, with the first refusal's words
//     and the next try;
//   - bastions (Config.Bastions): the ProxyCommand through each jump
//     host, carrying the key, known_hosts and BatchMode to the hop, and
//     which bastion is in use; one that does not answer is skipped for
//     the next;
//   - host keys: checking is never turned off from here (WeakHostKey,
//     Effective read what the user's settings would do), and with
//     KnownHosts set it is strict against that file alone;
//   - ssh's words: which failures ssh says happened before anything ran
//     (NeverRan, Refused), which lines of stderr decide a failure
//     (Decisive; a failed call's stderr leads with them, Lead), and which
//     are its multiplexing noise rather than the remote command's;
//   - the remote deadline: a command with a deadline runs under timeout(1)
//     on the login node, so that what the caller gave up on does not run
//     on there (deadline.go; docs/design/slurm-remote-deadline.md).
//
// It knows ssh, not Slurm: what a remote command means, what its words
// say, whether a login needing a person holds anything back, and how
// failures back off are the caller's (package slurm). The only remote
// words it is told of are Config.RemoteSaid's, a command that exits 255
// (ssh's own failure status) by itself. It parses no configuration file
// (ssh reads the user's) and owns no credential: the worker's credential
// travels in a remote command's stdin, which it passes through and never
// logs.
package sshrun
