package main

import (
	"embed"
	"io/fs"
	"net/http"
)

// The status page at / is one HTML file, a script and a style sheet,
// embedded in the binary: no build step, nothing fetched from elsewhere,
// and it works without a network. The script reads GET /status (its first
// 100 rows of each list, and the counts of all) and GET /v1/events from
// the same origin and draws the run at a glance (counts by state, a
// progress bar, the pace and the time left, the machines, what waits and
// what needs a person, tasks ended over time), then the tasks, workers,
// jobs, provisioners, failures, a time-to-attach chart and a timeline,
// each capped at 100 rows; see web/app.js.
//
// The Content-Security-Policy lets the page load and connect to its own
// origin alone, so even a value from a plugin that slipped into markup
// could neither run nor send anything anywhere.

//go:embed web
var webFiles embed.FS

const pageCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// pageHandler serves the page and its files.
func pageHandler() http.Handler {
	// "web" is a valid path inside the embedded tree: Sub cannot fail.
	sub, _ := fs.Sub(webFiles, "web")
	files := http.FileServerFS(sub)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", pageCSP)
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}
