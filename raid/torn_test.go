package raid_test

import (
	"bytes"
	"encoding/binary"
	"slices"
	"testing"

	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/raid/raidtest"
)

// Superblock fields the torn-update tests edit (see doc.go, # Layout).
const (
	sbEventsOff = 88  // u64 events counter
	sbStatesOff = 160 // one state byte per role: 0 active, 1 faulty, 2 rebuilding
)

// TestTornSuperblockUpdate: a crash in the middle of a superblock update leaves some members
// exactly one event behind. Such a member missed nothing and must be accepted, or every crash
// during a checkpoint would cost a member (or, with two behind, the array). Two events behind, or
// recorded as faulty by the others, it did miss changes and is left out: the array assembles
// degraded without it.
func TestTornSuperblockUpdate(t *testing.T) {
	for _, tc := range []struct {
		name    string
		edit    func(ms []*raidtest.Mem)
		leftOut int // the role assembled without, -1 none
	}{
		{"one behind, active in the others' table", func(ms []*raidtest.Mem) {
			editSuperblock(ms[2], func(sb []byte) { addEvents(sb, -1) })
		}, -1},
		{"two members one behind", func(ms []*raidtest.Mem) {
			editSuperblock(ms[0], func(sb []byte) { addEvents(sb, -1) })
			editSuperblock(ms[3], func(sb []byte) { addEvents(sb, -1) })
		}, -1},
		{"two behind", func(ms []*raidtest.Mem) {
			editSuperblock(ms[2], func(sb []byte) { addEvents(sb, -2) })
		}, 2},
		{"one behind and recorded faulty", func(ms []*raidtest.Mem) {
			editSuperblock(ms[2], func(sb []byte) { addEvents(sb, -1) })
			for _, i := range []int{0, 1, 3} {
				editSuperblock(ms[i], func(sb []byte) { sb[sbStatesOff+2] = 1 })
			}
		}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := createMem(t, "t", 4)
			// Data written through the whole array, then the crash-shaped superblocks.
			a, err := raid.AssembleMembers(asMembers(ms), raid.AssembleOptions{})
			if err != nil {
				t.Fatal(err)
			}
			want := bytes.Repeat([]byte("torn superblock update "), 2000)
			if _, err := a.WriteAt(want, 4096); err != nil {
				t.Fatal(err)
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			for _, m := range ms {
				m.Reopen()
			}
			tc.edit(ms)

			a, err = raid.AssembleMembers(asMembers(ms), raid.AssembleOptions{})
			if err != nil {
				t.Fatalf("assemble after a torn update: %v", err)
			}
			defer a.Close()
			want4 := []int(nil)
			if tc.leftOut >= 0 {
				want4 = []int{tc.leftOut}
			}
			if st := a.Status(); !slices.Equal(st.Missing, want4) {
				t.Fatalf("assembled with roles %v missing, want %v", st.Missing, want4)
			}
			got := make([]byte, len(want))
			if _, err := a.ReadAt(got, 4096); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("read back after a torn update: %v, equal %v", err, bytes.Equal(got, want))
			}
		})
	}
}

func addEvents(sb []byte, d int64) {
	ev := binary.LittleEndian.Uint64(sb[sbEventsOff:])
	binary.LittleEndian.PutUint64(sb[sbEventsOff:], uint64(int64(ev)+d))
}
