// Mapreduce counts the words of files with the engine kit: a map task
// per file, one reduce after them over the maps' outputs, the top ten
// printed; the engine passes on its own, and Wait is the whole loop.
//
//	mapreduce CONFIG FILE...
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/shared"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: mapreduce CONFIG FILE...")
		os.Exit(2)
	}
	cfg, diags := engine.LoadConfig(os.Args[1])
	if diags.HasErrors() {
		fmt.Fprintln(os.Stderr, diags.Error())
		os.Exit(1)
	}
	eng, err := engine.New(engine.Config{Provisioners: cfg.Provisioners, Secret: host.RandomSecret(),
		ID: host.EngineIdentity(cfg.Engine.ID, cfg.Path), Listen: cfg.Engine.Listen})
	if err == nil {
		err = eng.Serve(eng.Mux(nil, false))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctx := context.Background()
	defer eng.Stop(ctx)
	eng.Start(ctx)
	one := shared.Need{CPUs: 1}
	reduce := engine.TaskSpec{ID: "reduce", Need: one, Outputs: []string{"top.txt"},
		Command: []string{"sh", "-c", "cat counts/* | awk '{n[$2]+=$1} END {for (w in n) print n[w], w}' | sort -rn | head > top.txt"}}
	for i, file := range os.Args[2:] {
		id := fmt.Sprintf("map-%d", i)
		eng.Submit(engine.TaskSpec{ID: id, Need: one, Outputs: []string{"counts.txt"},
			Inputs:  []engine.Input{{Name: "in.txt", Path: file}},
			Command: []string{"sh", "-c", "tr -cs A-Za-z '\\n' < in.txt | sort | uniq -c > counts.txt"}})
		reduce.Inputs = append(reduce.Inputs, engine.Input{Name: "counts/" + id, FromTask: id, Path: "counts.txt"})
	}
	if _, err := eng.Submit(reduce); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	if res, err := eng.Wait(ctx, "reduce"); err != nil || res[0].State != "succeeded" {
		fmt.Fprintln(os.Stderr, "reduce:", err, res)
		return
	}
	top, _ := os.ReadFile(eng.TaskDir("reduce") + "/outputs/top.txt")
	fmt.Print(string(top))
}
