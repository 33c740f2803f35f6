// Package bench measures the Slurm provisioner against baselines taken in
// the same run, on the sandbox Slurm that sandbox/up.sh starts.
//
// It has no code of its own outside its tests. Each measurement is a Go
// benchmark (go test -bench . ./bench, with the sandbox's environment
// exported) that reports its figures with b.ReportMetric, and
// TestBenchReport, which runs only when BENCH_REPORT=1 (make bench sets
// it), takes every measurement once, prints one table of figures beside
// their baselines and targets, and writes docs/benchmarks.md.
// BENCH_ONLY=array,reconcile (step names, report_test.go's benchOnly)
// takes only those measurements, prints their rows and leaves
// docs/benchmarks.md as it was: a table of some rows would pass for the
// whole.
//
// Measurement 13 (scale) takes the plugin to 100, 1,000 and 10,000
// machines outstanding, and measurement 10 (attach-scale) the engine to
// as many workers attached, each holding a long poll; the 10,000 rows add
// about a minute, and BENCH_SCALE_MAX=1000 leaves them out where the
// machine cannot hold them.
//
// Measurement 14 (validate) asks nothing of Slurm: BenchmarkValidate
// runs without the sandbox. Neither do measurements 15 to 17 (dispatch,
// transfer, queued: tasks_test.go), which run the engine with the
// reference plugin and real worker processes on this machine; they run
// in make bench all the same, and take about five minutes;
// BenchmarkTasks takes them without the sandbox.
//
// Nothing here asserts a timing: a missed target is reported as MISS, and
// only a measurement that could not be taken fails.
package bench
