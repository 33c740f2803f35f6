package sandboxtest

import (
	"fmt"
	"net/http"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics reads a Prometheus /metrics page at url with Prometheus' own
// text parser and returns the value of each of names that it has: a
// gauge, counter or untyped family's samples summed (the Go runtime's
// go_goroutines and go_memstats_* have one; a per-provisioner gauge such
// as fluksio_plugin_heap_live_bytes sums to all the plugins'). A name
// the page lacks is left out of the map.
func Metrics(client *http.Client, url string, names ...string) (map[string]float64, error) {
	resp, err := client.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s is not Prometheus text: %w", url, err)
	}
	out := map[string]float64{}
	for _, name := range names {
		f := fams[name]
		if f == nil || len(f.GetMetric()) == 0 {
			continue
		}
		for _, m := range f.GetMetric() {
			switch {
			case m.Gauge != nil:
				out[name] += m.GetGauge().GetValue()
			case m.Counter != nil:
				out[name] += m.GetCounter().GetValue()
			case m.Untyped != nil:
				out[name] += m.GetUntyped().GetValue()
			}
		}
	}
	return out, nil
}
