package shared

import "runtime/metrics"

// runtimeSamples are the runtime/metrics names ReadRuntime reads, in
// Runtime's field order.
var runtimeSamples = []string{
	"/gc/heap/live:bytes",
	"/memory/classes/heap/objects:bytes",
	"/sched/goroutines:goroutines",
}

// ReadRuntime is this Go process's Runtime, from runtime/metrics: a
// read of a few counters the runtime keeps, without stopping the world
// (runtime.ReadMemStats would). A Go plugin puts it in each
// StatusResponse (docs/design/shared-plugin-runtime.md says why).
func ReadRuntime() *Runtime {
	s := make([]metrics.Sample, len(runtimeSamples))
	for i, name := range runtimeSamples {
		s[i].Name = name
	}
	metrics.Read(s)
	v := func(i int) int64 {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return int64(s[i].Value.Uint64())
	}
	return &Runtime{HeapLiveBytes: v(0), HeapObjectsBytes: v(1), Goroutines: v(2)}
}
