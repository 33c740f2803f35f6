package slurm

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/sbatch"
	"github.com/fluksio/provision/slurm/sshrun"
)

// Defaults, each with the reason for its value.
const (
	// defaultMaxIdle is how long a worker waits for work before it exits
	// and gives its allocation back: long enough to catch the next node of
	// a busy flow, short enough not to sit on somebody's cluster.
	defaultMaxIdle = "5m"
	// defaultProvisionTimeout is how long a request may go without its
	// worker attaching before the job is cancelled. Queues are slow; a
	// request that has not started in a quarter of an hour is more likely
	// stuck than late.
	defaultProvisionTimeout = "15m"
	// defaultSubmitTimeout bounds one ssh call. A login node that has not
	// answered sbatch in half a minute is not going to.
	defaultSubmitTimeout = "30s"
	// defaultTokenTTL, empty, means the credential lives as long as its
	// job can: provision_timeout (the longest it waits in the queue) plus
	// the profile's time limit plus tokenMargin (credentialTTL). A job
	// without a time limit asks for a week, which the engine caps. A credential sits in the
	// scheduler's spool with the job, so it should not outlive it; and it
	// must not expire under a worker that is still working.
	defaultTokenTTL = ""
	// defaultPollInterval is how often the queue is read while something
	// is outstanding. Sites ask for minutes, not seconds, between
	// squeues, and slurmctld itself updates its view every 30 to 60
	// seconds; a job that died is noticed within this long.
	defaultPollInterval = "30s"
	// defaultAttachTimeout is how long a job may run without its worker
	// attaching. A worker dials the engine within seconds of starting;
	// ten minutes covers a slow module load or a cold filesystem.
	defaultAttachTimeout = "10m"
)

// Caps, each with the reason for its value. A burst of machines is one
// sbatch however large (array.go), so what a site feels is how many jobs
// sit in its queue and how many nodes one account holds, not how many
// submissions reach slurmctld.
const (
	// defaultMaxWorkers caps a provisioner's machines alive at once
	// (pending + starting + attached): 256 is a large flow's worth and a
	// fraction of any cluster worth bursting to, and a runaway engine
	// cannot take a whole partition.
	defaultMaxWorkers = 256
	// defaultMaxPending caps its machines waiting in the queue at once:
	// 64 is one burst that reaches real parallelism in one queue wait,
	// well below the per-user job limits sites set (MaxSubmitJobs is
	// commonly in the hundreds to thousands), and it keeps the fair-share
	// cost of machines nobody ends up using small.
	defaultMaxPending = 64
)

// minPollInterval is the interval below which validation warns: a squeue
// every few seconds is what site rules forbid.
const minPollInterval = 10 * time.Second

// Config is the provisioner's configuration as the host sends it: the
// schema's attributes by name and its profile blocks as a list. Durations
// stay strings here; they are parsed during validation so that a bad one
// is reported at its path.
type Config struct {
	Login Logins `json:"login"`
	// Bastion is the jump hosts the login nodes are reached through,
	// tried in order (bastion.go); none when empty.
	Bastion          Logins   `json:"bastion"`
	SSHPort          int      `json:"ssh_port"`
	SSHKey           string   `json:"ssh_key"`
	KnownHosts       string   `json:"known_hosts"`
	SSHConfig        string   `json:"ssh_config"`
	SSHOptions       []string `json:"ssh_options"`
	EngineURL        string   `json:"engine_url"`
	ArtifactURL      string   `json:"artifact_url"`
	MaxIdle          string   `json:"max_idle"`
	ProvisionTimeout string   `json:"provision_timeout"`
	SubmitTimeout    string   `json:"submit_timeout"`
	TokenTTL         string   `json:"token_ttl"`
	PollInterval     string   `json:"poll_interval"`
	AttachTimeout    string   `json:"attach_timeout"`
	WorkerCommand    []string `json:"worker_command"`
	// LogDir is where jobs write their output on the cluster
	// (joblog.go); empty means defaultLogDir.
	LogDir string `json:"log_dir"`
	// LogDirKeep is how many job logs log_dir keeps (joblog.go); a
	// pointer so that absent (logKeepDefault) is told from 0.
	LogDirKeep *int `json:"log_dir_keep"`
	// Multiplex and MaxSessions are pointers so that absent can be told
	// from false and 0; fillDefaults fills them in (see ssh.go).
	Multiplex   *bool `json:"multiplex"`
	MaxSessions *int  `json:"max_sessions"`
	// MaxRPCRate is the login user's RPC budget (slurm/internal/queue/budget.go); a pointer,
	// so that absent can be told from 0.
	MaxRPCRate *float64 `json:"max_rpc_rate"`
	// MaxWorkers and MaxPending cap the whole provisioner (see
	// defaultMaxWorkers); a profile may cap itself lower.
	// Pointers, like Multiplex, so that absent can be told from 0.
	MaxWorkers *int `json:"max_workers"`
	MaxPending *int `json:"max_pending"`
	// Reach says how workers reach the engine: "direct" (they dial
	// engine_url) or "relay" (they dial a relay on the login node, which
	// the plugin carries to the engine; relay.go).
	Reach        string   `json:"reach"`
	RelayListen  string   `json:"relay_listen"`
	RelayHost    string   `json:"relay_host"`
	RelayCommand []string `json:"relay_command"`
	// Profiles are decoded one by one in decodeConfig, so that a type
	// error can be reported with the index of its profile.
	Profiles []Profile `json:"-"`
}

// Profile is one kind of machine the cluster can be asked for. It is named
// like a flavor and is deliberately not one: a flavor is what a node asks
// for, a profile is what a scheduler is asked for. They agree when
// somebody sets them up to.
type Profile struct {
	Name  string `json:"name"`
	CPUs  int    `json:"cpus"`
	GPUs  int    `json:"gpus"`
	RAMMB int64  `json:"ram_mb"`
	// Labels are what a worker started this way advertises, so that a
	// node bound to a device can be the reason one is started.
	Labels []string `json:"labels"`
	// Sbatch lines go into the script verbatim: partition, walltime,
	// account, and whatever else the site needs.
	Sbatch []string `json:"sbatch"`
	// Prerun is shell run before the worker starts: module load, a venv
	// with the worker in it. Deliberately not pip: what is installed on a
	// cluster is somebody's decision, not this provisioner's.
	Prerun []string `json:"prerun"`
	// MinWorkers are kept alive whatever the demand: warm machines. Zero
	// MaxWorkers and MaxPending mean the provisioner's caps alone.
	MinWorkers int `json:"min_workers"`
	MaxWorkers int `json:"max_workers"`
	MaxPending int `json:"max_pending"`
	// Nodes is how many machines one allocation of this profile is: a
	// job of Nodes nodes running one worker on each (multinode.go). The
	// caps and the demand count machines, so they move Nodes at a time.
	Nodes int `json:"nodes"`
	// Exclusive asks for whole nodes (--exclusive, and --mem=0 unless
	// the sbatch lines set memory): the worker then offers what Slurm
	// gave its job, and the profile's shape is its partition's smallest
	// node (exclusive.go).
	Exclusive bool `json:"exclusive"`

	// opts is what the script needs of the Sbatch lines, read once when
	// the configuration is (parseConfigAt); nil for a profile made
	// otherwise, whose lines options reads when asked.
	opts *sbatchOpts
}

// UnmarshalJSON fills in the schema's defaults for whatever is absent or
// null, so a profile decoded without a host still asks for one CPU.
func (p *Profile) UnmarshalJSON(b []byte) error {
	type plain Profile
	v := plain{CPUs: 1, Nodes: 1}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*p = Profile(v)
	return nil
}

func schema() *shared.Schema {
	return &shared.Schema{
		Attributes: []shared.Attribute{
			{Name: "login", Type: shared.TypeStringOrList, Required: true,
				Description: "The login node as user@host or user@host:port (or a Host alias from ssh_config), or a list of them, tried in order: one that does not answer is skipped until it answers again. Every cluster command runs there over ssh."},
			{Name: "bastion", Type: shared.TypeStringOrList,
				Description: "A jump host the login node is reached through, as user@host or user@host:port, or a list of them, tried in order: the first that answers is used, and one that does not is skipped. The plugin's ssh reaches it with this provisioner's ssh_key and known_hosts (which then holds both the bastion's and the login node's keys). Not with a ProxyJump or ProxyCommand of ssh_config or ssh_options: one way through."},
			{Name: "ssh_port", Type: shared.TypeInt, Default: 0,
				Description: "The login node's ssh port; 0 leaves it to ssh and its config."},
			{Name: "ssh_key", Type: shared.TypeString, Default: "",
				Description: "Path to the private key ssh logs in with, passed as -i."},
			{Name: "known_hosts", Type: shared.TypeString, Default: "",
				Description: "Path to a known_hosts file with the login node's key. When set, ssh checks the host key strictly against it."},
			{Name: "ssh_config", Type: shared.TypeString, Default: "",
				Description: "Path to an ssh_config file, passed as -F."},
			{Name: "ssh_options", Type: shared.TypeListString,
				Description: "More ssh options, each Key=Value, passed as -o Key=Value (for example ConnectTimeout=10)."},
			{Name: "multiplex", Type: shared.TypeBool, Default: true,
				Description: "Keep one ssh connection to the login node open and run every command through it (OpenSSH ControlMaster). While on, its ControlMaster, ControlPath and ControlPersist take precedence over ssh_config and ssh_options; off leaves multiplexing to them."},
			{Name: "max_sessions", Type: shared.TypeInt, Default: sshrun.DefaultMaxSessions,
				Description: "How many ssh commands may run on the login node at once. Most sshd allow 10 sessions per connection (MaxSessions); stay below it."},
			{Name: "engine_url", Type: shared.TypeString, Default: "",
				Description: "The engine's URL as a compute node sees it: the worker dials it. Required with reach = \"direct\"; with reach = \"relay\" only its scheme counts (https when the engine serves TLS), since workers dial the relay."},
			{Name: "reach", Type: shared.TypeString, Default: reachDirect,
				Description: "How workers reach the engine: \"direct\" (they dial engine_url) or \"relay\" (they dial a relay on the login node, and the plugin carries each connection to the engine over its ssh connection; for compute nodes that cannot reach the engine)."},
			{Name: "relay_listen", Type: shared.TypeString, Default: "",
				Description: "With reach = \"relay\": host:port the relay listens on, on the login node. Empty: every interface and a free port."},
			{Name: "relay_host", Type: shared.TypeString, Default: "",
				Description: "With reach = \"relay\": the login node's name or address as compute nodes reach it. Empty: the login node's own host name."},
			{Name: "relay_command", Type: shared.TypeListString,
				Description: "With reach = \"relay\": the plugin binary as the site installed it on the login node, and any words before its own; the plugin adds \"relay -listen ADDR [-host NAME] [-tls]\" (with -tls, the relay's certificate and key follow on its standard input, so the relay must be this plugin's version). Unset: the plugin copies its own binary to ~/.cache/fluksio on the login node, once per version, and runs the relay from a private copy checked by its sha256 at each start."},
			{Name: "artifact_url", Type: shared.TypeString, Default: "",
				Description: "Where the worker fetches and stores artifacts, if not through the engine."},
			{Name: "max_idle", Type: shared.TypeDuration, Default: defaultMaxIdle,
				Description: "How long a worker waits for work before it exits and gives its allocation back."},
			{Name: "provision_timeout", Type: shared.TypeDuration, Default: defaultProvisionTimeout,
				Description: "How long a request may go without its worker attaching before its job is cancelled, counted from the request. Jobs with a time limit also get an sbatch --deadline from it, so the queue drops them if the provisioner is gone."},
			{Name: "attach_timeout", Type: shared.TypeDuration, Default: defaultAttachTimeout,
				Description: "How long a job may run without its worker attaching before it is cancelled, counted from when it was first seen running. Waiting in the queue does not count."},
			{Name: "max_rpc_rate", Type: shared.TypeNumber, Default: defaultMaxRPCRate,
				Description: "How many RPCs a second the provisioners that log in as this user from this machine send slurmctld together, whatever engine or block they are in: each command waits its turn in one budget they share, and a poll that waits is a slower poll, said in the status. Once slurmctld's rate limiter is read from its configuration (SlurmctldParameters=rl_enable), at most three quarters of its refill. The default stays under Slurm's default refill of 2 a second."},
			{Name: "poll_interval", Type: shared.TypeDuration, Default: defaultPollInterval,
				Description: "How often the queue is read, with one squeue for all jobs, while anything is outstanding (10% jitter). Nothing is read while nothing is outstanding."},
			{Name: "submit_timeout", Type: shared.TypeDuration, Default: defaultSubmitTimeout,
				Description: "How long one ssh call to the login node may take. Connecting and the ssh handshake get half of it (ssh's ConnectTimeout), unless ssh_options sets ConnectTimeout."},
			{Name: "token_ttl", Type: shared.TypeDuration, Default: defaultTokenTTL,
				Description: "How long a worker's credential is good for. Unset: as long as its job can live (provision_timeout plus the profile's --time plus 10 minutes; without a --time, the engine's cap). The engine caps every credential (12 hours by default)."},
			{Name: "worker_command", Type: shared.TypeListString,
				Description: "The worker program and any leading arguments, as the site installed it where the compute nodes see it. Unset: the plugin ships the fluksio-worker built with it (beside its own executable) to ~/.local/share/fluksio/bin on the login node, once per version, and each job checks it by its sha256 before running it; the compute nodes must then see the login user's home directory."},
			{Name: "log_dir", Type: shared.TypeString, Default: "",
				Description: "Where jobs write their output (stdout and stderr, one file per job: JOBID.out, or ARRAYID_TASK.out), on the cluster's shared filesystem as the login node sees it. Relative paths and ~/ are under the login user's home; made on first use. A job that ends before its worker attaches is reported with the last lines of its file. Empty: ~/.local/state/fluksio/<provisioner name>. A profile that sets --output keeps its own."},
			{Name: "log_dir_keep", Type: shared.TypeInt, Default: logKeepDefault,
				Description: "How many job logs log_dir keeps, the newest, and at most 64 MiB of them: a worker that ends well removes its job's log itself, so what stays is of jobs that failed or were cut short, for reading back. The rest are removed when the provisioner starts. 0 keeps none; validate -check says what log_dir holds."},
			{Name: "max_workers", Type: shared.TypeInt, Default: defaultMaxWorkers,
				Description: "The most machines this provisioner keeps alive at once, pending, starting and attached, over all profiles."},
			{Name: "max_pending", Type: shared.TypeInt, Default: defaultMaxPending,
				Description: "The most machines this provisioner keeps waiting in the queue at once, over all profiles. A burst is one sbatch (a job array), so this bounds the queue, not the submissions."},
		},
		Blocks: []shared.BlockType{profileBlock()},
	}
}

// profileBlock is the schema of a profile block: one kind of machine.
func profileBlock() shared.BlockType {
	return shared.BlockType{
		Name:        "profile",
		Labels:      []string{"name"},
		MinItems:    1,
		Description: "One kind of machine the cluster can be asked for. The smallest profile that fits a need is asked for.",
		Body: &shared.Schema{Attributes: []shared.Attribute{
			{Name: "cpus", Type: shared.TypeInt, Default: 1,
				Description: "CPUs a machine of this profile has; asked for as --cpus-per-task unless sbatch sets it."},
			{Name: "gpus", Type: shared.TypeInt, Default: 0,
				Description: "GPUs it has; asked for as --gres=gpu:N unless sbatch sets GPUs."},
			{Name: "ram_mb", Type: shared.TypeInt, Default: 0,
				Description: "Memory in MB; asked for as --mem unless sbatch sets memory. 0 means unknown and constrains nothing."},
			{Name: "labels", Type: shared.TypeListString,
				Description: "Labels the worker advertises, so a node that needs one can cause this profile to be asked for."},
			{Name: "sbatch", Type: shared.TypeListString,
				Description: "sbatch options, one per line, written into the script as #SBATCH lines: partition, time, account."},
			{Name: "prerun", Type: shared.TypeListString,
				Description: "Shell lines run before the worker starts, such as module load or activating a venv."},
			{Name: "min_workers", Type: shared.TypeInt, Default: 0,
				Description: "Machines of this profile kept alive whatever the demand (warm workers). Each still leaves after max_idle without work, and is asked for again."},
			{Name: "max_workers", Type: shared.TypeInt, Default: 0,
				Description: "The most machines of this profile alive at once; 0 means only the provisioner's max_workers caps it."},
			{Name: "max_pending", Type: shared.TypeInt, Default: 0,
				Description: "The most machines of this profile waiting in the queue at once; 0 means only the provisioner's max_pending caps it."},
			{Name: "nodes", Type: shared.TypeInt, Default: 1,
				Description: "Nodes in one allocation of this profile (--nodes); 0 and 1 both mean one. Each node runs a worker of its own (srun), with its own name and credential, and is one machine to the caps and the demand, which the provisioner meets a whole allocation at a time."},
			{Name: "exclusive", Type: shared.TypeBool, Default: false,
				Description: "Whole nodes: the script adds #SBATCH --exclusive (unless sbatch has it) and --mem=0 (unless sbatch sets memory), and the worker offers what Slurm gave its job (SLURM_CPUS_ON_NODE, SLURM_MEM_PER_NODE, the job's GPUs), within its credential. The profile's shape, which the engine packs tasks by, is the smallest node of its partition as sinfo shows it when the shapes are listed (cpus, gpus and ram_mb where sinfo cannot be read); credentials are minted for it. cpus, gpus and ram_mb stay the least it asks for. Not with nodes above 1, nor with --oversubscribe."},
		}},
	}
}

// settings is a configuration that has passed validation, with its
// durations parsed and its profiles in match order. It never changes once
// built, so it may be read without the Provisioner's lock.
type settings struct {
	name string
	Config
	maxIdle          time.Duration
	provisionTimeout time.Duration
	submitTimeout    time.Duration
	// checkWait is how long a check's command may wait for Slurm
	// (Check: the caller's whole -check-timeout), where longer than
	// submitTimeout; zero for a run.
	checkWait     time.Duration
	tokenTTL      time.Duration
	pollInterval  time.Duration
	attachTimeout time.Duration
	// logins are the login nodes of Login, in the order they are tried
	// (logins.go).
	logins []sshrun.Login
	// bastions are the jump hosts of Bastion, in the order they are
	// tried (bastion.go).
	bastions []sshrun.Login
	// multiplex and maxSessions are Multiplex and MaxSessions resolved
	// (validateSSH).
	multiplex   bool
	maxSessions int
	// maxRPCRate is MaxRPCRate resolved (validateBudget).
	maxRPCRate float64
	log        hclog.Logger
	// engineID and epoch tag every job (tag.go); set by Configure.
	engineID, epoch string
	// begins is each profile's --begin (begin.go), read from its sbatch
	// lines once here, since Reconcile asks it of every outstanding
	// request on every call; nil for a profile without one.
	begins map[string]*sbatch.Begin
	// now is the provisioner's clock when the configuration was read:
	// validation counts a --begin from it (validateBegin).
	now time.Time
}

// host is the login node without its user, for error messages: the
// first, or all of them when there are several.
func (s *settings) host() string {
	if len(s.logins) == 0 {
		return s.Login.String()
	}
	hosts := make([]string, len(s.logins))
	for i, a := range s.logins {
		hosts[i] = a.Host()
	}
	return strings.Join(hosts, " or ")
}

// firstLogin is the first login node, or Login as written before
// validation has resolved it (a test's settings).
func (s *settings) firstLogin() sshrun.Login {
	if len(s.logins) > 0 {
		return s.logins[0]
	}
	if len(s.Login.Entries) > 0 {
		return sshrun.Login{Dest: s.Login.Entries[0]}
	}
	return sshrun.Login{}
}

// loginList is the login nodes in order: logins, or the first login as
// written when validation has not resolved them (a test's settings).
func (s *settings) loginList() []sshrun.Login {
	if len(s.logins) > 0 {
		return s.logins
	}
	return []sshrun.Login{s.firstLogin()}
}

// parseConfig decodes and validates a configuration. It has no side
// effects: ValidateConfig and Configure both call it.
func parseConfig(name string, raw json.RawMessage) (*settings, shared.Diagnostics) {
	return parseConfigAt(name, raw, time.Now())
}

// parseConfigAt is parseConfig with the provisioner's clock reading now.
func parseConfigAt(name string, raw json.RawMessage, now time.Time) (*settings, shared.Diagnostics) {
	c, diags := decodeConfig(raw)
	if diags.HasErrors() {
		return nil, diags
	}
	s := &settings{name: name, Config: *c, now: now}
	diags = append(diags, validate(s)...)
	if diags.HasErrors() {
		return nil, diags
	}
	sortProfiles(s.Profiles)
	for i := range s.Profiles {
		s.Profiles[i].opts = readOpts(s.Profiles[i].Sbatch)
	}
	s.begins = map[string]*sbatch.Begin{}
	for _, pr := range s.Profiles {
		s.begins[pr.Name] = s.beginSpecOf(pr)
	}
	return s, diags
}

// decodeConfig reads the JSON the host sends. Absent and null values take
// the schema's defaults, so a host that fills nothing in still works.
func decodeConfig(raw json.RawMessage) (*Config, shared.Diagnostics) {
	if len(raw) == 0 {
		raw = json.RawMessage("{}")
	}
	var wire struct {
		Config
		Profiles []json.RawMessage `json:"profile"`
	}
	if err := json.Unmarshal(raw, &wire); err != nil {
		return nil, shared.Diagnostics{decodeError(nil, err)}
	}
	c := wire.Config
	for i, r := range wire.Profiles {
		var p Profile
		if err := json.Unmarshal(r, &p); err != nil {
			return nil, shared.Diagnostics{decodeError([]string{"profile", strconv.Itoa(i)}, err)}
		}
		c.Profiles = append(c.Profiles, p)
	}
	c.fillDefaults()
	return &c, nil
}

// fillDefaults gives what is absent its default. An empty duration counts
// as absent; an empty worker_command list does not, and fails validation,
// while an absent one (nil) means the worker is shipped.
func (c *Config) fillDefaults() {
	for _, d := range []struct {
		v   *string
		def string
	}{
		{&c.MaxIdle, defaultMaxIdle},
		{&c.ProvisionTimeout, defaultProvisionTimeout},
		{&c.SubmitTimeout, defaultSubmitTimeout},
		{&c.PollInterval, defaultPollInterval},
		{&c.AttachTimeout, defaultAttachTimeout},
	} {
		if *d.v == "" {
			*d.v = d.def
		}
	}
	for _, d := range []struct {
		v   **int
		def int
	}{{&c.MaxWorkers, defaultMaxWorkers}, {&c.MaxPending, defaultMaxPending}} {
		if *d.v == nil {
			v := d.def
			*d.v = &v
		}
	}
	// WorkerCommand stays nil when absent: the plugin ships its own
	// worker then (ship.go).
	if c.Reach == "" {
		c.Reach = reachDirect
	}
	for i := range c.Profiles {
		// 0, like 1, is one node; a negative count fails validation.
		if c.Profiles[i].Nodes == 0 {
			c.Profiles[i].Nodes = 1
		}
	}
	c.fillSSHDefaults()
}

// decodeError turns a JSON error into a diagnostic at the value it is
// about. encoding/json names the field but not the list index, which is
// why profiles are decoded one at a time.
func decodeError(at []string, err error) shared.Diagnostic {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		path := slices.Clone(at)
		if te.Field != "" {
			parts := strings.Split(te.Field, ".")
			path = append(path, parts[len(parts)-1])
		}
		return shared.Errorf(path, "Wrong type",
			"Expected %s here, found %s. The host should have converted it; check the plugin and host versions.", te.Type, te.Value)
	}
	return shared.Errorf(at, "Unreadable configuration",
		"The configuration is not the JSON object this plugin expects (%v). The host and the plugin may speak different versions.", err)
}

var (
	// sshKeyRE is an ssh option name: letters only, so that it cannot
	// smuggle a second option or a value.
	sshKeyRE = regexp.MustCompile(`^[A-Za-z]+$`)
)

// refusedSSHOptions change what ssh runs or how the script reaches sbatch;
// the value is why, for the diagnostic.
var refusedSSHOptions = map[string]string{
	"batchmode":               "the provisioner sets BatchMode=yes itself so that a prompt fails instead of hanging a submission",
	"remotecommand":           "the provisioner chooses the remote command",
	"sessiontype":             "the provisioner needs a session that runs a command",
	"stdinnull":               "the batch script reaches sbatch on ssh's standard input",
	"forkafterauthentication": "the provisioner reads sbatch's answer from ssh and waits for it to finish",
	"requesttty":              "a terminal would mangle the script on standard input",
}

// validate checks everything that reaches the batch script or the ssh
// command line, so that no configured value can change what either means.
func validate(s *settings) shared.Diagnostics {
	var diags shared.Diagnostics
	add := func(d shared.Diagnostic) { diags = append(diags, d) }
	at := func(p ...string) []string { return p }

	if s.name == "" {
		add(shared.Errorf(nil, "Missing provisioner name", "The provisioner block needs a name; it goes into job and worker names."))
	} else if !shared.ValidName(s.name) {
		add(shared.Errorf(nil, "Invalid provisioner name",
			"The name %q may use only letters, digits, '.', '_' and '-': it goes into Slurm job names and worker names.", s.name))
	}

	diags = append(diags, validateLogins(s)...)
	diags = append(diags, validateBastions(s)...)

	if s.LogDir != "" && !validLogDir(s.LogDir) {
		add(shared.Errorf(at("log_dir"), "Invalid log_dir",
			"%q cannot be used: sbatch reads white space, quotes, backslashes and '#' in an #SBATCH line itself, and '%%' starts one of its file name patterns. Choose a path without them; ~/ and relative paths are under the login user's home.", s.LogDir))
	}
	if s.LogDirKeep != nil && (*s.LogDirKeep < 0 || *s.LogDirKeep > logKeepMax) {
		add(shared.Errorf(at("log_dir_keep"), "Invalid log_dir_keep",
			"log_dir_keep must be between 0 and %d; got %d. It is how many job logs log_dir keeps after their jobs end.", logKeepMax, *s.LogDirKeep))
	}

	diags = append(diags, validateSSHArgs(s)...)
	diags = append(diags, validateSSH(s)...)
	diags = append(diags, validateBudget(s)...)
	diags = append(diags, validateTrustFiles(s)...)

	diags = append(diags, validateURL("engine_url", s.EngineURL, s.Reach != reachRelay)...)
	diags = append(diags, validateReach(s)...)
	diags = append(diags, validateURL("artifact_url", s.ArtifactURL, false)...)

	diags = append(diags, validateDurations(s)...)
	diags = append(diags, validateWorkerCommand(s)...)

	if len(s.Profiles) == 0 {
		add(shared.Errorf(at("profile"), "No profiles", `Add at least one profile "name" { cpus = 1 } block: it says what the cluster can be asked for.`))
	}
	seen := map[string]bool{}
	for i, p := range s.Profiles {
		diags = append(diags, validateProfile(strconv.Itoa(i), p, seen)...)
		diags = append(diags, validateBegin(s, strconv.Itoa(i), p)...)
	}
	diags = append(diags, validateCaps(s)...)
	return diags
}

// validateSSHArgs checks what reaches ssh's command line as written:
// ssh_port, the ssh_key, ssh_config and known_hosts paths, and every
// ssh_options entry.
func validateSSHArgs(s *settings) shared.Diagnostics {
	var diags shared.Diagnostics
	add := func(d shared.Diagnostic) { diags = append(diags, d) }
	at := func(p ...string) []string { return p }

	if s.SSHPort < 0 || s.SSHPort > 65535 {
		add(shared.Errorf(at("ssh_port"), "Invalid ssh_port", "The port must be between 1 and 65535, or 0 to leave it to ssh; got %d.", s.SSHPort))
	}
	for _, f := range []struct{ name, path string }{{"ssh_key", s.SSHKey}, {"ssh_config", s.SSHConfig}} {
		if strings.ContainsAny(f.path, "\x00\n\r") {
			add(shared.Errorf(at(f.name), "Invalid path", "The path must not contain a newline, carriage return or NUL."))
		}
	}
	if strings.ContainsFunc(s.KnownHosts, func(r rune) bool { return isSpaceOrControl(r) || r == '"' || r == '\'' }) {
		add(shared.Errorf(at("known_hosts"), "Invalid path",
			"The known_hosts path must not contain whitespace, quotes or control characters: ssh reads it from an option line, where whitespace separates several files."))
	}
	for i, o := range s.SSHOptions {
		path := at("ssh_options", strconv.Itoa(i))
		key, value, ok := strings.Cut(o, "=")
		switch {
		case strings.ContainsAny(o, "\x00\n\r"):
			add(shared.Errorf(path, "Invalid ssh option", "An ssh option must not contain a newline, carriage return or NUL."))
		case !ok || !sshKeyRE.MatchString(key) || value == "":
			add(shared.Errorf(path, "Invalid ssh option", "Write each option as Key=Value, such as ConnectTimeout=10, with a key of letters only; got %q.", o))
		case refusedSSHOptions[strings.ToLower(key)] != "":
			add(shared.Errorf(path, "Unsupported ssh option", "%s cannot be set here: %s.", key, refusedSSHOptions[strings.ToLower(key)]))
		case sshrun.WeakHostKey(key, value) != "":
			add(shared.Errorf(path, "Host-key checking cannot be weakened",
				"%s. A worker's credential travels to the login node in the batch script, so the login node's key must be checked: remove this option, and pin the key with known_hosts.", sshrun.WeakHostKey(key, value)))
		case s.KnownHosts != "" && (strings.EqualFold(key, "StrictHostKeyChecking") || strings.EqualFold(key, "UserKnownHostsFile")):
			add(shared.Errorf(path, "Conflicting ssh option",
				"known_hosts is set, so the provisioner passes %s itself; remove this option or known_hosts.", key))
		}
	}
	return diags
}

// validateURL checks the URL v of attribute name: an absolute http or
// https URL, or empty where it is not required.
func validateURL(name, v string, required bool) shared.Diagnostics {
	if v == "" {
		if !required {
			return nil
		}
		detail := fmt.Sprintf("Set %s to an http or https URL that compute nodes can reach.", name)
		if name == "engine_url" {
			detail += ` If they cannot reach the engine, set reach = "relay": they then dial a relay on the login node.`
		}
		return shared.Diagnostics{shared.Errorf([]string{name}, "Missing "+name, "%s", detail)}
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.ContainsFunc(v, isSpaceOrControl) {
		return shared.Diagnostics{shared.Errorf([]string{name}, "Invalid "+name, "%q is not an absolute http or https URL, such as https://engine.example.org:8765.", v)}
	}
	return nil
}

// validateDurations parses the durations into s (maxIdle and the rest)
// and warns of a poll_interval below minPollInterval. An empty token_ttl
// stays 0: it is derived from each profile's time limit.
func validateDurations(s *settings) shared.Diagnostics {
	var diags shared.Diagnostics
	add := func(d shared.Diagnostic) { diags = append(diags, d) }
	at := func(p ...string) []string { return p }

	for _, d := range []struct {
		name string
		raw  string
		dst  *time.Duration
	}{
		{"max_idle", s.MaxIdle, &s.maxIdle},
		{"provision_timeout", s.ProvisionTimeout, &s.provisionTimeout},
		{"submit_timeout", s.SubmitTimeout, &s.submitTimeout},
		{"token_ttl", s.TokenTTL, &s.tokenTTL},
		{"poll_interval", s.PollInterval, &s.pollInterval},
		{"attach_timeout", s.AttachTimeout, &s.attachTimeout},
	} {
		if d.name == "token_ttl" && d.raw == "" {
			continue // derived from each profile's time limit
		}
		v, err := time.ParseDuration(d.raw)
		switch {
		case err != nil:
			add(shared.Errorf(at(d.name), "Invalid duration", "%q is not a duration; write it like \"90s\", \"5m\" or \"1h30m\".", d.raw))
		case v <= 0:
			add(shared.Errorf(at(d.name), "Invalid duration", "%s must be positive; got %q.", d.name, d.raw))
		default:
			*d.dst = v
		}
	}
	if s.pollInterval > 0 && s.pollInterval < minPollInterval {
		add(shared.Diagnostic{Severity: shared.SeverityWarning, Path: at("poll_interval"), Summary: "Frequent polling",
			Detail: fmt.Sprintf("poll_interval %s reads the queue more often than most sites allow; slurmctld serves every user, and %s or more is kinder to it.", s.pollInterval, minPollInterval)})
	}
	return diags
}

// validateWorkerCommand checks worker_command: absent (the plugin ships
// its worker) or a program and its arguments, each fit for the script.
func validateWorkerCommand(s *settings) shared.Diagnostics {
	var diags shared.Diagnostics
	add := func(d shared.Diagnostic) { diags = append(diags, d) }
	at := func(p ...string) []string { return p }

	if s.WorkerCommand != nil && len(s.WorkerCommand) == 0 {
		add(shared.Errorf(at("worker_command"), "Empty worker_command", `Set worker_command to the worker program, such as ["/shared/fluksio/bin/fluksio-worker"], or leave it out for the plugin to ship its own.`))
	} else if len(s.WorkerCommand) > 0 && s.WorkerCommand[0] == "" {
		add(shared.Errorf(at("worker_command", "0"), "Empty worker program", "The first element of worker_command is the program to run and must not be empty."))
	}
	for i, w := range s.WorkerCommand {
		if strings.ContainsAny(w, "\x00\n\r") {
			add(shared.Errorf(at("worker_command", strconv.Itoa(i)), "Invalid worker_command", "An argument must not contain a newline, carriage return or NUL."))
		}
	}
	return diags
}

// maxCap bounds every cap: far above any cluster an engine bursts to, so
// that arithmetic on counts stays small.
const maxCap = 1_000_000

// validateCaps checks max_workers, max_pending and min_workers, at the
// provisioner and in each profile, against each other.
func validateCaps(s *settings) shared.Diagnostics {
	var diags shared.Diagnostics
	add := func(d shared.Diagnostic) { diags = append(diags, d) }
	for _, c := range []struct {
		name string
		v    int
	}{{"max_workers", *s.MaxWorkers}, {"max_pending", *s.MaxPending}} {
		if c.v < 1 || c.v > maxCap {
			add(shared.Errorf([]string{c.name}, "Invalid "+c.name, "%s must be between 1 and %d; got %d.", c.name, maxCap, c.v))
		}
	}
	warm := 0
	for i, p := range s.Profiles {
		at := func(name string) []string { return []string{"profile", strconv.Itoa(i), name} }
		for _, c := range []struct {
			name string
			v    int
		}{{"min_workers", p.MinWorkers}, {"max_workers", p.MaxWorkers}, {"max_pending", p.MaxPending}} {
			if c.v < 0 || c.v > maxCap {
				add(shared.Errorf(at(c.name), "Invalid "+c.name, "%s must be between 0 and %d; got %d.", c.name, maxCap, c.v))
			}
		}
		if n := p.Nodes; n > 1 && n <= maxNodes {
			// A profile is asked for a whole allocation at a time, so a
			// cap below one allocation would keep it from ever starting.
			for _, c := range []struct {
				name string
				v    int
			}{{"max_workers", s.maxWorkers(p)}, {"max_pending", s.maxPending(p)}} {
				if c.v >= 1 && c.v < n {
					add(shared.Errorf(at("nodes"), "nodes above "+c.name,
						"An allocation of profile %s is %d machines (nodes = %d), but %s lets only %d be %s at once, so it could never be asked for; lower nodes or raise %s.",
						p.Name, n, n, c.name, c.v, map[string]string{"max_workers": "alive", "max_pending": "pending"}[c.name], c.name))
				}
			}
		}
		if p.MinWorkers > 0 && p.MaxWorkers > 0 && p.MinWorkers > p.MaxWorkers {
			add(shared.Errorf(at("min_workers"), "min_workers above max_workers",
				"Profile %s keeps %d warm but may have only %d alive; lower min_workers or raise max_workers.", p.Name, p.MinWorkers, p.MaxWorkers))
		}
		warm += max(0, p.MinWorkers)
	}
	if *s.MaxWorkers >= 1 && warm > *s.MaxWorkers {
		add(shared.Errorf([]string{"max_workers"}, "min_workers add up to more than max_workers",
			"The profiles keep %d machines warm in all, but the provisioner may have only %d alive; lower their min_workers or raise max_workers.", warm, *s.MaxWorkers))
	}
	return diags
}

// maxWorkers and maxPending are a profile's caps in effect: its own when
// set, and never above the provisioner's.
func (s *settings) maxWorkers(p Profile) int {
	if p.MaxWorkers > 0 {
		return min(p.MaxWorkers, *s.MaxWorkers)
	}
	return *s.MaxWorkers
}

func (s *settings) maxPending(p Profile) int {
	if p.MaxPending > 0 {
		return min(p.MaxPending, *s.MaxPending)
	}
	return *s.MaxPending
}

func validateProfile(i string, p Profile, seen map[string]bool) shared.Diagnostics {
	var diags shared.Diagnostics
	add := func(d shared.Diagnostic) { diags = append(diags, d) }
	at := func(p ...string) []string { return append([]string{"profile", i}, p...) }

	switch {
	case !shared.ValidName(p.Name):
		add(shared.Errorf(at("name"), "Invalid profile name",
			"The name %q may use only letters, digits, '.', '_' and '-', and must not be empty: it goes into worker names.", p.Name))
	case seen[p.Name]:
		add(shared.Errorf(at("name"), "Duplicate profile", "Another profile is already named %q; give each profile its own name.", p.Name))
	}
	seen[p.Name] = true

	if p.CPUs < 1 {
		add(shared.Errorf(at("cpus"), "Invalid cpus", "A machine has at least one CPU; got %d.", p.CPUs))
	}
	if p.GPUs < 0 {
		add(shared.Errorf(at("gpus"), "Invalid gpus", "gpus must be 0 or more; got %d.", p.GPUs))
	}
	if p.Nodes < 0 || p.Nodes > maxNodes {
		add(shared.Errorf(at("nodes"), "Invalid nodes", "nodes must be between 1 and %d; got %d.", maxNodes, p.Nodes))
	}
	if p.RAMMB < 0 {
		add(shared.Errorf(at("ram_mb"), "Invalid ram_mb", "ram_mb must be 0 (unknown) or more; got %d.", p.RAMMB))
	}
	for j, l := range p.Labels {
		if !shared.ValidName(l) {
			add(shared.Errorf(at("labels", strconv.Itoa(j)), "Invalid label",
				"The label %q may use only letters, digits, '.', '_' and '-', and must not be empty: labels are passed to the worker as a comma list.", l))
		}
	}
	for j, line := range p.Sbatch {
		diags = append(diags, validateSbatchLine(at("sbatch", strconv.Itoa(j)), p, line)...)
	}
	diags = append(diags, validateExclusive(at, p)...)
	for j, line := range p.Prerun {
		if strings.ContainsAny(line, "\x00\n\r") {
			add(shared.Errorf(at("prerun", strconv.Itoa(j)), "Invalid prerun line",
				"A prerun line must not contain a newline, carriage return or NUL; give each command its own list element."))
		}
	}
	return diags
}

// validateSbatchLine checks one of profile p's sbatch lines, at path:
// one #SBATCH line that sets options sbatch reads, none of them the
// provisioner's, none contradicting the profile.
func validateSbatchLine(path []string, p Profile, line string) shared.Diagnostics {
	var diags shared.Diagnostics
	add := func(d shared.Diagnostic) { diags = append(diags, d) }
	if strings.ContainsAny(line, "\x00\n\r") {
		add(shared.Errorf(path, "Invalid sbatch line", "An sbatch line must not contain a newline, carriage return or NUL: each becomes one #SBATCH line."))
		return diags
	}
	// sbatch reads every word of the line (sbatch.ParseLine), so every
	// word is checked.
	opts, err := sbatch.ParseLine(line)
	switch {
	case err != nil:
		add(shared.Errorf(path, "Invalid sbatch line", "%s.", err))
		return diags
	case len(opts) == 0:
		add(shared.Errorf(path, "Invalid sbatch line", "%q sets no sbatch option; write it as it would follow #SBATCH, such as --partition=debug.", line))
		return diags
	}
	if opt, why := reservedOption(opts); opt != "" {
		add(shared.Errorf(path, "Reserved sbatch option", "%s cannot be set in a profile: %s.", opt, why))
	}
	for _, o := range opts {
		if o.Is("--begin", 'b') && o.HasValue {
			if _, err := sbatch.ParseBegin(strings.TrimSpace(o.Value)); err != nil {
				add(shared.Errorf(path, "Invalid --begin", "--begin=%s: %s, \"Invalid --begin specification\". Slurm reads now+N[seconds|minutes|hours|days|weeks], HH:MM[:SS] [AM|PM], midnight, noon, elevenses, fika, teatime, today, tomorrow, MM/DD[/YY], MMDD[YY], YYYY-MM-DD[THH:MM[:SS]] and uts<seconds>, or those combined (tomorrow 16:00).", o.Value, err))
			}
		}
		if o.Is("--deadline", 0) && o.HasValue {
			if d := deadlineTooSoon(p.Sbatch, o.Value); d != "" {
				add(shared.Errorf(path, "A --deadline before the job can end", "%s", d))
			}
		}
		summary, detail := contradiction(p, o)
		switch {
		case summary == "":
		case strings.HasPrefix(summary, "Contradictory"):
			add(shared.Errorf(path, summary, "%s", detail))
		default:
			add(shared.Diagnostic{Severity: shared.SeverityWarning, Path: path, Summary: summary, Detail: detail})
		}
	}
	return diags
}

// reserved are sbatch options a profile may not set, with the reason.
// Short forms are keyed by their letter.
var reserved = []struct {
	long, short, why string
}{
	{"--job-name", "J", "the provisioner names every job fluksio-<provisioner> so that it can find its jobs again"},
	{"--comment", "", "the provisioner records the worker's name in the job's comment so that it can find the job again"},
	{"--parsable", "", "the provisioner passes it on the command line and reads the job id from its output"},
	{"--wrap", "", "the provisioner's script is the job; a wrapped command would replace it"},
	{"--array", "a", "the provisioner asks for bursts as job arrays itself, with a worker name and a credential per task; a profile's own array would start many workers with one"},
	{"--wait", "W", "sbatch would not return until the job ends, so every submission would time out"},
	{"--clusters", "M", "squeue and scancel run without it, so the provisioner would lose sight of the job"},
	{"--test-only", "", "sbatch would only test the script and submit nothing"},
	{"--nodes", "N", "a job runs one worker per node, and the profile's nodes attribute says how many (nodes = N); set it there"},
	{"--ntasks", "n", "a job runs one worker per node (nodes = N), so its tasks are the provisioner's to set"},
	{"--ntasks-per-node", "", "a job runs one worker per node (nodes = N), so its tasks are the provisioner's to set"},
}

// reservedOption returns the reserved option among opts, if any, and why
// it is reserved.
func reservedOption(opts []sbatch.Opt) (option, why string) {
	for _, o := range opts {
		for _, r := range reserved {
			var short byte
			if r.short != "" {
				short = r.short[0]
			}
			if o.Is(r.long, short) {
				if o.Long != "" {
					return r.long, r.why
				}
				return "-" + r.short, r.why
			}
		}
	}
	return "", ""
}

func isSpaceOrControl(r rune) bool {
	return unicode.IsSpace(r) || unicode.IsControl(r)
}
