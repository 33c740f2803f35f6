// Package testutil holds the small helpers the project's tests share.
package testutil

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer that goroutines (a logger, a plugin's stderr
// reader, an HTTP handler) may write while a test reads it.
type Buffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
