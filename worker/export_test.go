package worker

import "time"

// TestEngine is the test engine (testengine_test.go) for this package's
// examples: a test double of the engine's side of the protocol.
type TestEngine struct{ e *testEngine }

// StartTestEngine starts a TestEngine on 127.0.0.1; Close stops it.
func StartTestEngine() TestEngine { return TestEngine{startTestEngine()} }

// URL is where workers reach it; Token the credential it accepts.
func (te TestEngine) URL() string   { return te.e.URL() }
func (te TestEngine) Token() string { return te.e.token }
func (te TestEngine) Close()        { te.e.Close() }

// AddPayload queues a payload task and returns its ID.
func (te TestEngine) AddPayload(p string) string {
	return te.e.Add(Task{Requires: []string{FeaturePayload}, Payload: []byte(p)}, nil)
}

// Result is task id's result, once it has come (within 30 s).
func (te TestEngine) Result(id string) ResultRequest {
	deadline := time.After(30 * time.Second)
	for {
		te.e.mu.Lock()
		res, changed := te.e.tasks[id].result, te.e.changed
		te.e.mu.Unlock()
		if res != nil {
			return *res
		}
		select {
		case <-changed:
		case <-deadline:
			return ResultRequest{}
		}
	}
}
