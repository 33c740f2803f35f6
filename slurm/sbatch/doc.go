// Package sbatch is the sbatch language the Slurm plugin writes and reads,
// as pure functions: no ssh, no cluster, no settings.
//
// It owns:
//   - the words of a #SBATCH line and the options getopt sees in them
//     (Words, ParseLine, Opts, Opt);
//   - the --begin forms, read as Slurm's parse_time reads them (ParseBegin,
//     Begin, RelativeBegin, BeginOf);
//   - time limits (TimeLimit, ParseTimeLimit);
//   - job and array task ids as sbatch, squeue and scancel write them
//     (IsJobID, IsJobRef, SplitTask, ExpandJobID, CompactIDs,
//     IsScancelArg, ArraySpec);
//   - the tag in each job's comment that says whose job it is (Tag,
//     ParseTag, TagPrefix).
//
// What a profile may say, what the provisioner reserves and what its
// clocks make of a begin are package slurm's: they depend on its settings.
//
// A profile's sbatch lines go into the script as "#SBATCH <line>", and
// sbatch reads every word of such a line, not only the first: it splits
// the line at white space (space, tab, newline, vertical tab, form feed,
// carriage return), honours single and double quotes and backslash
// escapes, stops at an unquoted '#', and hands the words to getopt_long
// with its own option table (Slurm 22.05, src/sbatch/opt.c,
// _get_argument). A line that also names "hetjob" or "packjob" starts a
// heterogeneous job component. Validation reads each line the same way,
// so that an option the provisioner owns cannot hide in a line's second
// word ("--partition=x --array=1-100", "-p x -J y", "--time=5\v-J y").
// What this package does not do: check that an option exists or that its
// value is good. That is Slurm's to say (sbatch --test-only).
//
// Why a burst is one job array and why a job's comment carries a tag:
// docs/design/slurm-arrays.md and docs/design/slurm-tags.md.
package sbatch
