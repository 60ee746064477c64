package vm

import (
	"bufio"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestBench runs guest/bench.sh in one boot (make bench-vm; RAID5D_VM_BENCH=1): md RAID-5,
// md with skip_copy, md exported by nbdkit and raid5d, on the same four RAM disks, in
// alternating rounds, and prints the medians and their ratios as one table. It asserts nothing
// about speed; it fails only if a config does not run. ROUNDS, RUNTIME (seconds per fio job),
// SIZE (MiB) and CONFIGS pass through to the guest.
func TestBench(t *testing.T) {
	runBench(t, "bench-vm", "bench.sh", "nbd", "brd rd_nr=4 rd_size=262144", "crc32c_generic", "raid456") // crc32c: libcrc32c's soft dependency
}

// TestBenchRemote runs guest/bench-remote.sh in one boot (make bench-vm-remote;
// RAID5D_VM_BENCH=1): four nbdkit file servers in the guest stand for the member hosts; md
// RAID-5 over nbd-client devices attached to them against raid5d with the same servers as
// nbd+unix:// members, in alternating rounds; one table of medians and ratios, as TestBench.
func TestBenchRemote(t *testing.T) {
	runBench(t, "bench-vm-remote", "bench-remote.sh", "nbd", "crc32c_generic", "raid456")
}

// runBench boots once for a benchmark script (under RAID5D_VM_BENCH=1, else it skips: target
// is the make target that sets it), with 3 GiB and the benchmarks' kernel command line, and
// prints its RESULT and "vm:" lines, then benchTable's table of the RESULT lines.
func runBench(t *testing.T, target, script string, modules ...string) {
	if os.Getenv("RAID5D_VM_BENCH") != "1" {
		t.Skipf("a benchmark: make %s runs it (RAID5D_VM_BENCH=1)", target)
	}
	needGuest(t, "nbd-client", "mdadm", "fio", "nbdkit")
	load0 := hostLoad()
	res := runVM(t, vmRun{
		script:  guestScript(t, script),
		modules: modules,
		env:     passEnv("ROUNDS", "RUNTIME", "SIZE", "CONFIGS", "JOBS", "STALL_SECS"),
		memMiB:  3072,
		append:  benchAppend,
		timeout: 50 * time.Minute,
	})
	mustPass(t, res)
	fmt.Printf("host load average (1, 5, 15 min): %s at the start, %s at the end\n", load0, hostLoad())
	table, err := benchTable(res.output)
	if err != nil {
		t.Fatalf("%v; console:\n%s", err, res.output)
	}
	for _, line := range strings.Split(res.output, "\n") { // the rounds and the script's notes
		if strings.HasPrefix(line, "RESULT ") || strings.HasPrefix(line, "vm: ") {
			fmt.Println(line)
		}
	}
	fmt.Print(table)
}

// hostLoad is the host's load averages, as /proc/loadavg's first three fields (or "?").
func hostLoad() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "?"
}

// benchTable turns bench.sh's RESULT lines into the table: per workload, the median of the
// rounds for each config (MB/s for sequential jobs, IOPS for random ones), then the ratios of
// raid5d's configs (raid5d, raid5d+msk, raid5d-pc) to each of the others (and raid5d's to
// raid5d-b's, a before/after), twice: the ratio of the medians, and the median of each round's
// own ratio. The second is the one to read when the rounds spread: the host's load (the
// other work on this machine) moves every config's figures together over minutes, and a
// round's configs run minutes apart at most, so a round's ratio keeps what its figures lose.
// Each config's lowest and highest round follow.
func benchTable(console string) (string, error) {
	samples := map[[2]string][]float64{} // config, workload -> figures
	byRound := map[[3]string]float64{}   // config, workload, round -> figure
	var configs, workloads []string
	seen := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(console))
	rounds := 0
	for sc.Scan() {
		// RESULT ROUND CONFIG WORKLOAD KIB_PER_S IOPS
		f := strings.Fields(sc.Text())
		if len(f) != 6 || f[0] != "RESULT" {
			continue
		}
		round, err1 := strconv.Atoi(f[1])
		kib, err2 := strconv.ParseFloat(f[4], 64)
		iops, err3 := strconv.ParseFloat(f[5], 64)
		if err1 != nil || err2 != nil || err3 != nil {
			return "", fmt.Errorf("bad RESULT line %q", sc.Text())
		}
		rounds = max(rounds, round)
		config, workload := f[2], f[3]
		if !seen["c "+config] {
			seen["c "+config] = true
			configs = append(configs, config)
		}
		if !seen["w "+workload] {
			seen["w "+workload] = true
			workloads = append(workloads, workload)
		}
		v := kib * 1024 / 1e6 // MB/s
		if strings.HasPrefix(workload, "rand") {
			v = iops
		}
		k := [2]string{config, workload}
		samples[k] = append(samples[k], v)
		byRound[[3]string{config, workload, f[1]}] = v
	}
	if len(samples) == 0 {
		return "", fmt.Errorf("bench.sh printed no RESULT lines")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nmedians of %d rounds; sequential jobs in MB/s, random ones in IOPS\n\n", rounds)
	// raid5d's configs (raid5d, raid5d+msk, raid5d-pc) against each of the others
	var ours, others []string
	for _, c := range configs {
		if strings.HasPrefix(c, "raid5d") {
			ours = append(ours, c)
		} else {
			others = append(others, c)
		}
	}
	med := map[[2]string]float64{}
	for k, v := range samples {
		med[k] = median(v)
	}
	// each column as wide as its heading
	fmt.Fprintf(&b, "%-14s", "workload")
	for _, c := range configs {
		fmt.Fprintf(&b, " %*s", max(len(c), 7), c)
	}
	b.WriteString("\n")
	for _, w := range workloads {
		fmt.Fprintf(&b, "%-14s", w)
		for _, c := range configs {
			fmt.Fprintf(&b, " %*.0f", max(len(c), 7), med[[2]string{c, w}])
		}
		b.WriteString("\n")
	}
	var pairs [][2]string
	for _, o := range ours {
		for _, c := range others {
			pairs = append(pairs, [2]string{o, c})
		}
		if o != "raid5d-b" && seen["c raid5d-b"] {
			pairs = append(pairs, [2]string{o, "raid5d-b"})
		}
	}
	if len(pairs) > 0 {
		ratios(&b, "ratio", pairs, workloads, func(o, c, w string) (float64, bool) {
			d := med[[2]string{c, w}]
			return med[[2]string{o, w}] / d, d > 0
		})
		ratios(&b, "round ratios", pairs, workloads, func(o, c, w string) (float64, bool) {
			var rs []float64
			for r := 1; r <= rounds; r++ {
				a, okA := byRound[[3]string{o, w, strconv.Itoa(r)}]
				d, okD := byRound[[3]string{c, w, strconv.Itoa(r)}]
				if okA && okD && d > 0 {
					rs = append(rs, a/d)
				}
			}
			return median(rs), len(rs) > 0
		})
	}
	fmt.Fprintf(&b, "\n%-14s", "lowest-highest")
	for _, c := range configs {
		fmt.Fprintf(&b, " %*s", max(len(c), 9), c)
	}
	b.WriteString("\n")
	for _, w := range workloads {
		fmt.Fprintf(&b, "%-14s", w)
		for _, c := range configs {
			v := samples[[2]string{c, w}]
			lo, hi := v[0], v[0]
			for _, x := range v {
				lo, hi = min(lo, x), max(hi, x)
			}
			fmt.Fprintf(&b, " %*s", max(len(c), 9), fmt.Sprintf("%.0f-%.0f", lo, hi))
		}
		b.WriteString("\n")
	}
	return b.String(), nil
}

// ratios writes a block of ratios headed title: a column per pair (A/B), a row per workload,
// each cell f(A, B, workload), or "-" where f reports none.
func ratios(b *strings.Builder, title string, pairs [][2]string, workloads []string, f func(o, c, w string) (float64, bool)) {
	fmt.Fprintf(b, "\n%-14s", title)
	for _, p := range pairs {
		fmt.Fprintf(b, " %s", p[0]+"/"+p[1])
	}
	b.WriteString("\n")
	for _, w := range workloads {
		fmt.Fprintf(b, "%-14s", w)
		for _, p := range pairs {
			width := len(p[0] + "/" + p[1])
			if r, ok := f(p[0], p[1], w); ok {
				fmt.Fprintf(b, " %*.2f", width, r)
			} else {
				fmt.Fprintf(b, " %*s", width, "-")
			}
		}
		b.WriteString("\n")
	}
}

// median of xs (0 for none).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// TestBenchTable checks the table's arithmetic on canned RESULT lines (no VM): medians of
// three rounds, MB/s for sequential jobs and IOPS for random ones, raid5d's ratios of medians
// and the median of its rounds' ratios, the lowest and highest rounds.
func TestBenchTable(t *testing.T) {
	console := `[ 1.0] kernel noise
RESULT 1 md seqwrite-1M 100000 97
RESULT 1 raid5d seqwrite-1M 50000 48
RESULT 1 md randread-4k 4000 1000
RESULT 1 raid5d randread-4k 8000 2000
RESULT 2 raid5d seqwrite-1M 140000 136
RESULT 2 md seqwrite-1M 300000 290
RESULT 2 raid5d randread-4k 8000 3000
RESULT 2 md randread-4k 4000 1000
RESULT 3 md seqwrite-1M 200000 195
RESULT 3 raid5d seqwrite-1M 60000 58
RESULT 3 md randread-4k 4000 999
RESULT 3 raid5d randread-4k 8000 1000
`
	table, err := benchTable(console)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"medians of 3 rounds",
		"workload            md  raid5d",
		"seqwrite-1M        205      61", // 200000 and 60000 KiB/s in MB/s
		"randread-4k       1000    2000",
		"ratio          raid5d/md",
		"seqwrite-1M         0.30",
		"randread-4k         2.00",
		"round ratios   raid5d/md", // 0.50, 0.47, 0.30 and 2, 3, 2
		"seqwrite-1M         0.47",
		"randread-4k         2.00",
		"lowest-highest        md    raid5d",
		"seqwrite-1M      102-307    51-143",
		"randread-4k     999-1000 1000-3000",
	}
	for _, w := range want {
		if !strings.Contains(table, w) {
			t.Errorf("table lacks %q:\n%s", w, table)
		}
	}
	if _, err := benchTable("no results"); err == nil {
		t.Error("benchTable without RESULT lines: no error")
	}
}
