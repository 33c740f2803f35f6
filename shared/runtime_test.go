package shared

import (
	"runtime"
	"testing"
)

// TestReadRuntimeSeesTheHeapHeld: the live heap ReadRuntime reports grows
// by what the process holds on to across a collection, and goes back
// down when it lets go; the goroutines count this one.
func TestReadRuntimeSeesTheHeapHeld(t *testing.T) {
	runtime.GC()
	before := ReadRuntime()
	if before.HeapLiveBytes <= 0 || before.HeapObjectsBytes <= 0 || before.Goroutines < 1 {
		t.Fatalf("ReadRuntime() = %+v; want a heap and at least this goroutine", *before)
	}
	held := make([][]byte, 64)
	for i := range held {
		held[i] = make([]byte, 1<<20)
	}
	runtime.GC()
	during := ReadRuntime()
	if grew := during.HeapLiveBytes - before.HeapLiveBytes; grew < 60<<20 {
		t.Errorf("live heap grew %d bytes while 64 MiB were held; want at least 60 MiB", grew)
	}
	runtime.KeepAlive(held)
	held = nil
	runtime.GC()
	after := ReadRuntime()
	if after.HeapLiveBytes > before.HeapLiveBytes+16<<20 {
		t.Errorf("live heap %d bytes after letting 64 MiB go, %d before; want it back", after.HeapLiveBytes, before.HeapLiveBytes)
	}
	_ = held
}
