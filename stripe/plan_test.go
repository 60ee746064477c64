package stripe

import (
	"bytes"
	"crypto/subtle"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestPlanGolden plans each state in testdata/plan/*.txt and compares the plan with the one
// written below the state's "-- plan" line; -update rewrites those from PlanWrite. The format
// is described in testdata/plan/README.md.
func TestPlanGolden(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "plan", "*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 15 {
		t.Fatalf("%d golden plans, want at least 15", len(files))
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) {
			text, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			in, _, _ := strings.Cut(string(text), planSep)
			l, w, err := parseState(in)
			if err != nil {
				t.Fatal(err)
			}
			var p Plan
			PlanWrite(&p, l, w)
			got := in + planSep + renderPlan(l, &p)
			if *update {
				if err := os.WriteFile(f, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			if got != string(text) {
				t.Errorf("plan differs (go test ./stripe -run TestPlanGolden -update rewrites it):\n--- want\n%s\n--- got\n%s", text, got)
			}
		})
	}
}

const planSep = "-- plan\n"

// parseState reads a golden file's state: a layout line, the stripe, the missing chunk, whether
// parity is trusted, and one row of unit states per data chunk.
func parseState(text string) (Layout, WriteState, error) {
	var (
		l      Layout
		w      = WriteState{Missing: -1}
		rows   []string
		err    error
		hasLay bool
		miss   = "none"
		whole  bool
	)
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		switch {
		case f[0] == "layout" && len(f) == 4: // layout <members> <chunk>k <algorithm>
			n, err1 := strconv.Atoi(f[1])
			c, err2 := strconv.Atoi(strings.TrimSuffix(f[2], "k"))
			alg, err3 := ParseAlgorithm(f[3])
			if err1 != nil || err2 != nil || err3 != nil {
				return l, w, fmt.Errorf("bad line %q", line)
			}
			if l, err = NewLayout(n, int64(c)<<10, alg); err != nil {
				return l, w, err
			}
			hasLay = true
		case f[0] == "stripe" && len(f) == 2:
			if w.Stripe, err = strconv.ParseInt(f[1], 10, 64); err != nil {
				return l, w, err
			}
		case f[0] == "missing" && len(f) == 2: // none, P or d<k>
			miss = f[1]
		case f[0] == "parity" && len(f) == 2 && (f[1] == "trusted" || f[1] == "stale"):
			w.ParityStale = f[1] == "stale"
		case len(f) == 1 && f[0] == "whole": // every unit dirty, as WriteState.Units nil says
			whole = true
		case len(f) == 2 && f[0] == fmt.Sprintf("d%d", len(rows)):
			rows = append(rows, f[1])
		default:
			return l, w, fmt.Errorf("bad line %q", line)
		}
	}
	if !hasLay {
		return l, w, fmt.Errorf("no layout line")
	}
	D, upc := l.DataMembers(), l.UnitsPerChunk()
	if whole && len(rows) > 0 {
		return l, w, fmt.Errorf("both whole and chunk rows")
	}
	if !whole && len(rows) != D {
		return l, w, fmt.Errorf("%d chunk rows, want %d", len(rows), D)
	}
	switch {
	case miss == "none":
	case miss == "P":
		w.Missing = l.ParityMember(w.Stripe)
	case strings.HasPrefix(miss, "d"):
		d, err := strconv.Atoi(miss[1:])
		if err != nil || d < 0 || d >= D {
			return l, w, fmt.Errorf("bad missing %q", miss)
		}
		w.Missing = l.DataMember(w.Stripe, d)
	default:
		return l, w, fmt.Errorf("bad missing %q", miss)
	}
	if whole {
		return l, w, nil
	}
	w.Units = make([]uint8, D*upc)
	for d, row := range rows {
		if len(row) != upc {
			return l, w, fmt.Errorf("d%d: %d units, want %d", d, len(row), upc)
		}
		for u, c := range row {
			switch c {
			case '.':
			case 'U':
				w.Units[d*upc+u] = UnitUp
			case 'D':
				w.Units[d*upc+u] = UnitUp | UnitDirty
			default:
				return l, w, fmt.Errorf("d%d: unit state %q (want . U D)", d, c)
			}
		}
	}
	return l, w, nil
}

var colChars = [...]byte{ColClean: '.', ColEncode: 'E', ColUpdate: 'U', ColNoParity: '-'}

func renderPlan(l Layout, p *Plan) string {
	var b strings.Builder
	fmt.Fprintf(&b, "kind %v\n", p.Kind)
	cols := make([]byte, len(p.Cols))
	for u, c := range p.Cols {
		cols[u] = colChars[c]
	}
	fmt.Fprintf(&b, "cols %s\n", cols)
	run := func(dir string, r Run) {
		chunk := fmt.Sprintf("d%d", r.Chunk)
		if r.Chunk == ParityChunk(l) {
			chunk = "P"
		}
		units := fmt.Sprintf("u%d", r.Unit)
		if r.N > 1 {
			units += fmt.Sprintf("-%d", r.Unit+r.N-1)
		}
		buf := ""
		if r.Buf == BufOld {
			buf = " old"
		}
		fmt.Fprintf(&b, "%s m%d %s %s off %d%s\n", dir, r.Role, chunk, units, p.Off(r), buf)
	}
	for _, r := range p.Reads {
		run("read ", r)
	}
	for _, r := range p.Writes {
		run("write", r)
	}
	return b.String()
}

// TestPlanExecuted makes random stripe states — layouts, unit states, a missing member or none,
// stale parity or not — plans each, and executes the plan against an in-memory stripe the way a
// cache would: member reads into the head's units or the old-data scratch, parity per column,
// member writes. Units not up to date hold garbage in the head, and stale parity is wrong on
// the members wherever it can be rebuilt from the data, so a plan that reads too little, into
// the wrong buffer, from the wrong member, or folds into stale parity shows. Afterwards every
// member byte of the stripe is compared with the expected one, and the plan's reads with the
// cheaper of read-modify-write and reconstruct-write.
func TestPlanExecuted(t *testing.T) {
	rng := rand.New(rand.NewPCG(14, 5))
	algs := []Algorithm{LeftSymmetric, LeftAsymmetric, RightSymmetric, RightAsymmetric}
	var p Plan // reused: PlanWrite must reset it
	for i := range 3000 {
		n := 3 + rng.IntN(6)
		l, err := NewLayout(n, int64(4<<10)<<rng.IntN(3), algs[rng.IntN(len(algs))])
		if err != nil {
			t.Fatal(err)
		}
		s := rng.Int64N(3 * int64(n))
		missing := -1
		if rng.IntN(2) == 0 {
			missing = rng.IntN(n)
		}
		w := WriteState{Stripe: s, Missing: missing, ParityStale: rng.IntN(4) == 0}
		D, upc := l.DataMembers(), l.UnitsPerChunk()
		w.Units = make([]uint8, D*upc)
		pUp, pDirty := rng.Float64(), rng.Float64()
		for j := range w.Units {
			if rng.Float64() < pUp {
				w.Units[j] = UnitUp
				if rng.Float64() < pDirty {
					w.Units[j] |= UnitDirty
				}
			}
		}
		if rng.IntN(8) == 0 { // a stripe written whole: both ways of saying it plan alike
			for j := range w.Units {
				w.Units[j] = UnitUp | UnitDirty
			}
			PlanWrite(&p, l, w)
			want := renderPlan(l, &p)
			PlanWrite(&p, l, WriteState{Stripe: s, Missing: missing, ParityStale: w.ParityStale})
			if got := renderPlan(l, &p); got != want {
				t.Fatalf("case %d: the plan of a whole stripe (Units nil):\n%s\ndiffers from that of every unit dirty:\n%s", i, got, want)
			}
		}
		PlanWrite(&p, l, w)
		if err := execCheck(rng, l, w, &p); err != nil {
			var sb strings.Builder
			fmt.Fprintf(&sb, "layout %d %dk %v\nstripe %d\nmissing role %d\nstale %v\n", n, l.ChunkSize()>>10, l.Algorithm(), s, missing, w.ParityStale)
			for d := range D {
				fmt.Fprintf(&sb, "d%d ", d)
				for u := range upc {
					sb.WriteByte(".U?D"[w.Units[d*upc+u]])
				}
				sb.WriteByte('\n')
			}
			t.Fatalf("case %d: %v\n%s%s", i, err, sb.String(), renderPlan(l, &p))
		}
	}
}

// execCheck executes plan p of state w against random stripe contents and checks the result.
func execCheck(rng *rand.Rand, l Layout, w WriteState, p *Plan) error {
	D, upc, C, s := l.DataMembers(), l.UnitsPerChunk(), l.ChunkSize(), w.Stripe
	pm := l.ParityMember(s)
	dm := -1
	if w.Missing >= 0 && w.Missing != pm {
		dm = l.DataIndex(s, w.Missing)
	}
	random := func(n int64) []byte {
		b := make([]byte, n)
		for i := 0; i < len(b); i += 8 {
			binary.LittleEndian.PutUint64(b[i:], rng.Uint64())
		}
		return b
	}
	unit := func(b []byte, u int) []byte { return b[int64(u)*UnitSize : int64(u+1)*UnitSize] }
	dirty := func(d, u int) bool { return w.Units[d*upc+u]&UnitDirty != 0 }
	up := func(d, u int) bool { return w.Units[d*upc+u] != 0 }

	// The stripe's data before (old) and after (cur) the write, chunk by chunk.
	old, cur := make([][]byte, D), make([][]byte, D)
	for d := range D {
		old[d], cur[d] = random(C), random(C)
		for u := range upc {
			if !dirty(d, u) {
				copy(unit(cur[d], u), unit(old[d], u))
			}
		}
	}
	xor := func(chunks [][]byte) []byte {
		P := make([]byte, C)
		for _, c := range chunks {
			subtle.XORBytes(P, P, c)
		}
		return P
	}
	// The members: parity of the old data, stale where requested in the columns it could be
	// rebuilt from the data (the missing data unit, if any, is known).
	members := make([][]byte, l.Members()) // nil: missing
	for d := range D {
		members[l.DataMember(s, d)] = bytes.Clone(old[d])
	}
	members[pm] = xor(old)
	if w.ParityStale {
		for u := range upc {
			if dm < 0 || up(dm, u) {
				unit(members[pm], u)[0] ^= 0x5a
			}
		}
	}
	before := make([][]byte, len(members))
	for r := range members {
		before[r] = bytes.Clone(members[r])
	}
	if w.Missing >= 0 {
		members[w.Missing] = nil
	}
	// The head: current data in up-to-date units, garbage elsewhere; garbage scratch.
	head, scratch := make([][]byte, D+1), make([][]byte, D+1)
	for d := range D + 1 {
		head[d], scratch[d] = random(C), random(C)
		for u := 0; d < D && u < upc; u++ {
			if up(d, u) {
				copy(unit(head[d], u), unit(cur[d], u))
			}
		}
	}

	span := func(r Run, buf [][]byte) ([]byte, []byte, error) {
		if r.Chunk < 0 || r.Chunk > D || r.N < 1 || r.Unit < 0 || r.Unit+r.N > upc {
			return nil, nil, fmt.Errorf("run %+v out of the stripe", r)
		}
		m := members[r.Role]
		if m == nil {
			return nil, nil, fmt.Errorf("run %+v on the missing member", r)
		}
		off := p.Off(r) - s*C
		if off != int64(r.Unit)*UnitSize {
			return nil, nil, fmt.Errorf("run %+v at member offset %d, want stripe %d's unit %d", r, p.Off(r), s, r.Unit)
		}
		n := int64(r.N) * UnitSize
		return m[off : off+n], buf[r.Chunk][off : off+n], nil
	}
	bufOf := func(r Run) [][]byte {
		if r.Buf == BufOld {
			return scratch
		}
		return head
	}
	reads := 0
	for _, r := range p.Reads {
		m, b, err := span(r, bufOf(r))
		if err != nil {
			return err
		}
		copy(b, m)
		reads += r.N
	}
	if len(p.Cols) != upc {
		return fmt.Errorf("%d columns, want %d", len(p.Cols), upc)
	}
	shards := make([][]byte, D)
	for u, col := range p.Cols {
		P := unit(head[D], u)
		switch col {
		case ColEncode:
			for d := range D {
				shards[d] = unit(head[d], u)
			}
			copy(P, xor(shards)[:UnitSize])
		case ColUpdate:
			for d := range D {
				if dirty(d, u) {
					subtle.XORBytes(P, P, unit(scratch[d], u))
					subtle.XORBytes(P, P, unit(head[d], u))
				}
			}
		}
	}
	writes := 0
	for _, r := range p.Writes {
		if r.Buf != BufUnit {
			return fmt.Errorf("write %+v from the old-data scratch", r)
		}
		m, b, err := span(r, head)
		if err != nil {
			return err
		}
		copy(m, b)
		writes += r.N
	}

	// Every member byte, and the plan's I/O, against what it must be.
	wantP := xor(cur)
	dirtyCols, wantWrites := 0, 0
	for u := range upc {
		nd := 0
		for d := range D {
			if dirty(d, u) {
				nd++
				if d != dm {
					wantWrites++
				}
			}
		}
		if nd > 0 {
			dirtyCols++
			if w.Missing != pm {
				wantWrites++
			}
		}
		for d := range D {
			r := l.DataMember(s, d)
			if members[r] != nil && !bytes.Equal(unit(members[r], u), unit(cur[d], u)) {
				return fmt.Errorf("data chunk %d (member %d) unit %d is wrong after the write", d, r, u)
			}
		}
		if members[pm] == nil {
			continue
		}
		want := unit(before[pm], u)
		if nd > 0 {
			want = unit(wantP, u)
		}
		if !bytes.Equal(unit(members[pm], u), want) {
			return fmt.Errorf("parity unit %d (member %d) is wrong after the write (column %d dirty units)", u, pm, nd)
		}
	}
	if writes != wantWrites {
		return fmt.Errorf("%d units written, want %d (the dirty data and their columns' parity)", writes, wantWrites)
	}
	// The reads: none for a full stripe or a missing parity member; otherwise each column's
	// method reads the dirty units and parity (update) or the units not up to date (encode),
	// and with the choice free the stripe takes the cheaper method, a tie read-modify-writing.
	rmwCost, rcwCost, wantReads, nUp, nDirty := 0, 0, 0, 0, 0
	for u, col := range p.Cols {
		nd, nAll, presentUp := 0, 0, 0 // dirty units present, dirty units, up-to-date units present
		for d := range D {
			if up(d, u) {
				nUp++
				if d != dm {
					presentUp++
				}
			}
			if dirty(d, u) {
				nAll++
				nDirty++
				if d != dm {
					nd++
				}
			}
		}
		if nAll == 0 {
			if col != ColClean {
				return fmt.Errorf("column %d has no dirty unit but is %d", u, col)
			}
			continue
		}
		notUp := D - presentUp
		if dm >= 0 {
			notUp-- // the missing unit is never read
		}
		rmwCost += nd + 1
		rcwCost += notUp
		switch col {
		case ColUpdate:
			wantReads += nd + 1
		case ColEncode:
			wantReads += notUp
		case ColNoParity:
			if w.Missing != pm {
				return fmt.Errorf("column %d without parity, but the parity member is there", u)
			}
		default:
			return fmt.Errorf("dirty column %d is clean in the plan", u)
		}
	}
	if reads != wantReads {
		return fmt.Errorf("%d units read, want %d for the columns' methods", reads, wantReads)
	}
	if nUp == D*upc && reads != 0 {
		return fmt.Errorf("every unit is up to date, yet %d units read", reads)
	}
	if free := dm < 0 && w.Missing != pm && !w.ParityStale && dirtyCols > 0; free {
		if reads != min(rmwCost, rcwCost) {
			return fmt.Errorf("%d units read; read-modify-write reads %d, reconstruct-write %d", reads, rmwCost, rcwCost)
		}
		if rmwCost == rcwCost && rcwCost > 0 && p.Kind != KindRMW {
			return fmt.Errorf("read-modify-write and reconstruct-write both read %d units: a tie read-modify-writes", reads)
		}
	}
	wantKind := KindNone
	switch {
	case dirtyCols == 0:
	case nDirty == D*upc:
		wantKind = KindFull
	case bytes.IndexByte(colBytes(p.Cols), byte(ColUpdate)) >= 0:
		wantKind = KindRMW
	default:
		wantKind = KindRCW
	}
	if p.Kind != wantKind {
		return fmt.Errorf("kind %v, want %v", p.Kind, wantKind)
	}
	return nil
}

// TestPlanWriteAllocs: planning into a reused Plan allocates nothing.
func TestPlanWriteAllocs(t *testing.T) {
	l, _ := NewLayout(5, 64<<10, LeftSymmetric)
	w := WriteState{Stripe: 7, Missing: -1, Units: make([]uint8, l.DataMembers()*l.UnitsPerChunk())}
	for i := range w.Units {
		if i%3 == 0 {
			w.Units[i] = UnitUp | UnitDirty
		}
	}
	var p Plan
	PlanWrite(&p, l, w)
	if n := testing.AllocsPerRun(100, func() { PlanWrite(&p, l, w) }); n != 0 {
		t.Fatalf("PlanWrite allocates %v times per call", n)
	}
}

func colBytes(cols []Col) []byte {
	b := make([]byte, len(cols))
	for i, c := range cols {
		b[i] = byte(c)
	}
	return b
}
