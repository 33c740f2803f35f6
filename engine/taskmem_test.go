package engine

import (
	"context"
	"strconv"
	"testing"

	"github.com/fluksio/provision/shared"
)

// TestTasksQueuedMemory: 100,000 tasks queued (submitted, waiting, a
// router pass over them) hold well under the 200 MB an engine may
// spend on them: the live heap grows less than maxQueuedHeap (60.6 MB
// measured, 635 bytes a task, the caller's own strings included; the
// process's RSS went from 20 MB to 115 MB).
func TestTasksQueuedMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("submits 100,000 tasks")
	}
	const tasks = 100000
	const maxQueuedHeap = 80 << 20
	e, err := New(Config{Secret: testSecret, ID: "test", Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop(context.Background())
	before := liveHeap()
	t.Logf("before: %s", processMemory())
	for i := range tasks {
		if _, err := e.Submit(TaskSpec{Need: shared.Need{CPUs: 1 + i%4}, Command: []string{"sh", "-c", "work " + strconv.Itoa(i)},
			Env: map[string]string{"STEP": strconv.Itoa(i)}, Outputs: []string{"out"}}); err != nil {
			t.Fatal(err)
		}
	}
	e.router.Pass(context.Background())
	after := liveHeap()
	grew := int64(after) - int64(before)
	t.Logf("%d tasks queued: the live heap grew %.1f MB (%d bytes a task); %s", tasks, float64(grew)/(1<<20), grew/tasks, processMemory())
	if grew > maxQueuedHeap {
		t.Errorf("%d tasks queued grew the live heap by %d MB; want under %d MB", tasks, grew>>20, maxQueuedHeap>>20)
	}
	if res, ok := e.Task("t-" + strconv.Itoa(tasks)); !ok || res.State != TaskWaiting {
		t.Errorf("the last task: %+v", res)
	}
}
