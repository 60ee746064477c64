package stripe

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/md5"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/raid5d/raid5d/parity"
)

// The md fixtures (../testdata/md, see its README) are RAID-5 arrays written by Linux md. These
// tests read them through Layout and parity.Coder and must reproduce every logical sector and
// every parity chunk byte for byte: the proof that our layouts and parity are md's.

const mdFixtures = "../testdata/md"

// mdCase is what a fixture's case.txt says.
type mdCase struct {
	dir           string
	members       int
	chunk         int64
	alg           Algorithm
	memberFiles   []string
	dataOffset    int64 // the same on every member (checked)
	arraySize     int64
	perMemberData int64
	memberSize    int64
	stripes       int64
	md5           string
}

var (
	reN          = regexp.MustCompile(`(?m)^raid-devices \(N\): (\d+)$`)
	reChunk      = regexp.MustCompile(`(?m)^chunk: (\d+) bytes`)
	reLayout     = regexp.MustCompile(`(?m)^layout: (\S+)$`)
	reMember     = regexp.MustCompile(`(?m)^member (\d+): (\S+) = .*data offset (\d+) bytes`)
	reArraySize  = regexp.MustCompile(`(?m)^array-size: (\d+) bytes`)
	rePerMember  = regexp.MustCompile(`(?m)^per-member-data: (\d+) bytes`)
	reMemberSize = regexp.MustCompile(`(?m)^member-file-size: (\d+) bytes`)
	reStripes    = regexp.MustCompile(`(?m)^stripes: (\d+)$`)
	reMD5        = regexp.MustCompile(`(?m)^pattern-md5: ([0-9a-f]{32})\b`)
)

func parseCase(t *testing.T, dir string) mdCase {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "case.txt"))
	if err != nil {
		t.Fatal(err)
	}
	one := func(re *regexp.Regexp) string {
		m := re.FindAllStringSubmatch(string(raw), -1)
		if len(m) != 1 {
			t.Fatalf("%s/case.txt: want exactly one line matching %s, found %d", dir, re, len(m))
		}
		return m[0][1]
	}
	num := func(re *regexp.Regexp) int64 {
		v, err := strconv.ParseInt(one(re), 10, 64)
		if err != nil {
			t.Fatalf("%s/case.txt: %v", dir, err)
		}
		return v
	}
	c := mdCase{
		dir:           dir,
		members:       int(num(reN)),
		chunk:         num(reChunk),
		arraySize:     num(reArraySize),
		perMemberData: num(rePerMember),
		memberSize:    num(reMemberSize),
		stripes:       num(reStripes),
		md5:           one(reMD5),
	}
	if c.alg, err = ParseAlgorithm(one(reLayout)); err != nil {
		t.Fatalf("%s/case.txt: %v", dir, err)
	}
	ms := reMember.FindAllStringSubmatch(string(raw), -1)
	if len(ms) != c.members {
		t.Fatalf("%s/case.txt: %d member lines for N=%d", dir, len(ms), c.members)
	}
	c.memberFiles = make([]string, c.members)
	for _, m := range ms {
		i, _ := strconv.Atoi(m[1])
		off, _ := strconv.ParseInt(m[3], 10, 64)
		if i < 0 || i >= c.members || c.memberFiles[i] != "" {
			t.Fatalf("%s/case.txt: bad or repeated member %s", dir, m[1])
		}
		if c.dataOffset == 0 {
			c.dataOffset = off
		} else if off != c.dataOffset {
			t.Fatalf("%s/case.txt: member %d data offset %d, others %d (unequal offsets not supported here)", dir, i, off, c.dataOffset)
		}
		c.memberFiles[i] = m[2]
	}
	return c
}

func gunzip(t *testing.T, path string, size int64) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(bufio.NewReaderSize(f, 64<<10))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(zr, b); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if n, _ := io.Copy(io.Discard, zr); n != 0 {
		t.Fatalf("%s: %d bytes beyond the %d case.txt gives", path, n, size)
	}
	if err := zr.Close(); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return b
}

// mdPattern is the logical content the fixtures were filled with (README "The pattern"):
// sector s is "LBA %010d\n" then the byte s*7+13 repeated 497 times.
func mdPattern(size int64) []byte {
	b := make([]byte, 0, size)
	for s := range size / 512 {
		b = fmt.Appendf(b, "LBA %010d\n", s)
		b = append(b, bytes.Repeat([]byte{byte(s*7 + 13)}, 497)...)
	}
	return b
}

// mdArray is a fixture's member images with the geometry to read them.
type mdArray struct {
	mdCase
	images [][]byte // whole member images, superblock and all
}

// data returns member m's data area: the image after the data offset.
func (a *mdArray) data(m int) []byte { return a.images[m][a.dataOffset:] }

// chunkAt returns member m's chunk in stripe s.
func (a *mdArray) chunkAt(m int, s int64) []byte {
	return a.data(m)[s*a.chunk : (s+1)*a.chunk]
}

// wrongSectors reads every logical sector through l.Map and counts those that differ from
// the pattern.
func (a *mdArray) wrongSectors(l Layout, pattern []byte) (wrong int, first int64) {
	first = -1
	for s := range a.arraySize / 512 {
		loc := l.Map(s * 512)
		got := a.data(loc.Member)[loc.MemberOff : loc.MemberOff+512]
		if !bytes.Equal(got, pattern[s*512:(s+1)*512]) {
			if first < 0 {
				first = s
			}
			wrong++
		}
	}
	return wrong, first
}

// readArray reassembles the logical array through l.Extents, in requests of awkward sizes so
// that pieces start and end everywhere within chunks.
func (a *mdArray) readArray(l Layout) []byte {
	out := make([]byte, a.arraySize)
	sizes := []int64{512, 12345, a.chunk, 3*a.chunk + 1, 7, l.StripeSize() + 4096}
	var ext []Extent
	for off, i := int64(0), 0; off < a.arraySize; i++ {
		n := min(sizes[i%len(sizes)], a.arraySize-off)
		ext = l.Extents(ext[:0], off, n)
		for _, e := range ext {
			copy(out[off+e.BufOff:off+e.BufOff+e.Len], a.data(e.Member)[e.MemberOff:e.MemberOff+e.Len])
		}
		off += n
	}
	return out
}

// mdSuperblock is the part of md's v1.x superblock (struct mdp_superblock_1 in Linux's
// include/uapi/linux/raid/md_p.h, little-endian) these tests cross-check.
type mdSuperblock struct {
	magic, majorVersion     uint32
	level, layout           uint32
	size                    uint64 // used sectors per member
	chunkSectors, raidDisks uint32
	dataOffset, dataSize    uint64 // sectors
	superOffset             uint64 // sectors
	devNumber               uint32
	sbCsum, maxDev          uint32
	role                    uint16 // dev_roles[dev_number]
	csumOK                  bool
}

const (
	mdMagic       = 0xa92b4efc
	mdSuperOffset = 4096 // v1.2: 4 KiB from the start of the member
)

func parseMdSuperblock(b []byte) (mdSuperblock, error) {
	le := binary.LittleEndian
	if len(b) < 256 {
		return mdSuperblock{}, fmt.Errorf("superblock: %d bytes", len(b))
	}
	sb := mdSuperblock{
		magic:        le.Uint32(b[0:]),
		majorVersion: le.Uint32(b[4:]),
		level:        le.Uint32(b[72:]),
		layout:       le.Uint32(b[76:]),
		size:         le.Uint64(b[80:]),
		chunkSectors: le.Uint32(b[88:]),
		raidDisks:    le.Uint32(b[92:]),
		dataOffset:   le.Uint64(b[128:]),
		dataSize:     le.Uint64(b[136:]),
		superOffset:  le.Uint64(b[144:]),
		devNumber:    le.Uint32(b[160:]),
		sbCsum:       le.Uint32(b[216:]),
		maxDev:       le.Uint32(b[220:]),
	}
	end := 256 + 2*int(sb.maxDev)
	if sb.maxDev > 1920 || end > len(b) || sb.devNumber >= sb.maxDev {
		return sb, fmt.Errorf("superblock: max_dev %d, dev_number %d", sb.maxDev, sb.devNumber)
	}
	sb.role = le.Uint16(b[256+2*sb.devNumber:])
	// md's calc_sb_1_csum: the little-endian 32-bit words up to the end of dev_roles, with
	// sb_csum taken as zero, summed in 64 bits and folded to 32.
	var sum uint64
	i := 0
	for ; i+4 <= end; i += 4 {
		if i != 216 {
			sum += uint64(le.Uint32(b[i:]))
		}
	}
	if end-i == 2 {
		sum += uint64(le.Uint16(b[i:]))
	}
	sb.csumOK = uint32(sum&0xffffffff+sum>>32) == sb.sbCsum
	return sb, nil
}

func TestMdFixtures(t *testing.T) {
	dirs, err := filepath.Glob(filepath.Join(mdFixtures, "*", "case.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) == 0 {
		t.Fatalf("no md fixtures under %s", mdFixtures)
	}
	for _, p := range dirs {
		dir := filepath.Dir(p)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			t.Parallel()
			testMdFixture(t, dir)
		})
	}
}

func testMdFixture(t *testing.T, dir string) {
	c := parseCase(t, dir)
	l, err := NewLayout(c.members, c.chunk, c.alg)
	if err != nil {
		t.Fatal(err)
	}
	// case.txt's numbers agree with each other and with the geometry.
	if c.stripes*l.StripeSize() != c.arraySize || c.stripes*c.chunk != c.perMemberData ||
		c.dataOffset+c.perMemberData > c.memberSize || c.arraySize%512 != 0 {
		t.Fatalf("case.txt inconsistent: %+v", c)
	}
	a := &mdArray{mdCase: c}
	for _, f := range c.memberFiles {
		a.images = append(a.images, gunzip(t, filepath.Join(dir, f), c.memberSize))
	}

	t.Run("superblock", func(t *testing.T) {
		for i, img := range a.images {
			sb, err := parseMdSuperblock(img[mdSuperOffset:])
			if err != nil {
				t.Fatalf("member %d: %v", i, err)
			}
			for _, chk := range []struct {
				what      string
				got, want uint64
			}{
				{"magic", uint64(sb.magic), mdMagic},
				{"major_version", uint64(sb.majorVersion), 1},
				{"level", uint64(sb.level), 5},
				{"layout", uint64(sb.layout), uint64(c.alg)},
				{"chunksize (bytes)", uint64(sb.chunkSectors) * 512, uint64(c.chunk)},
				{"raid_disks", uint64(sb.raidDisks), uint64(c.members)},
				{"data_offset (bytes)", sb.dataOffset * 512, uint64(c.dataOffset)},
				{"super_offset (bytes)", sb.superOffset * 512, mdSuperOffset},
				{"size (bytes used per member)", sb.size * 512, uint64(c.perMemberData)},
				{"data_size >= size", min(sb.dataSize, sb.size), sb.size},
				{"role", uint64(sb.role), uint64(i)},
			} {
				if chk.got != chk.want {
					t.Errorf("member %d superblock %s = %d, case.txt says %d", i, chk.what, chk.got, chk.want)
				}
			}
			if !sb.csumOK {
				t.Errorf("member %d superblock checksum %#x does not match md's sum", i, sb.sbCsum)
			}
			// The checksum check can fail: one flipped bit in the array name breaks it.
			bad := bytes.Clone(img[mdSuperOffset : mdSuperOffset+4096])
			bad[40] ^= 1
			if sb, err := parseMdSuperblock(bad); err != nil || sb.csumOK {
				t.Errorf("member %d: superblock with a flipped bit parses as %v, checksum ok %v", i, err, sb.csumOK)
			}
		}
	})

	pattern := mdPattern(c.arraySize)
	if got := hex.EncodeToString(md5Sum(pattern)); got != c.md5 {
		t.Fatalf("regenerated pattern md5 %s, case.txt says %s: the pattern is misread", got, c.md5)
	}

	t.Run("read", func(t *testing.T) { // (a) every logical sector from md's members
		if wrong, first := a.wrongSectors(l, pattern); wrong != 0 {
			t.Errorf("%d of %d sectors wrong through Map, first %d", wrong, c.arraySize/512, first)
		}
		got := a.readArray(l)
		if i := firstDiff(got, pattern); i >= 0 {
			t.Errorf("array read through Extents differs from the pattern at byte %d (sector %d)", i, i/512)
		}
		if sum := hex.EncodeToString(md5Sum(got)); sum != c.md5 {
			t.Errorf("md5 of the array read through Extents = %s, case.txt says %s", sum, c.md5)
		}
	})

	coder, err := parity.New(l.DataMembers())
	if err != nil {
		t.Fatal(err)
	}
	t.Run("parity", func(t *testing.T) { // (b) md's parity chunks are Coder.Encode's
		shards := make([][]byte, c.members)
		p := make([]byte, c.chunk)
		for s := range c.stripes {
			for d := range l.DataMembers() {
				shards[d] = a.chunkAt(l.DataMember(s, d), s)
			}
			shards[c.members-1] = p
			if err := coder.Encode(shards); err != nil {
				t.Fatal(err)
			}
			pm := l.ParityMember(s)
			if i := firstDiff(p, a.chunkAt(pm, s)); i >= 0 {
				t.Fatalf("stripe %d: Encode's parity differs from md's (member %d) at byte %d", s, pm, i)
			}
			shards[c.members-1] = a.chunkAt(pm, s)
			if ok, err := coder.Verify(shards); err != nil || !ok {
				t.Fatalf("stripe %d: Verify of md's stripe = %v, %v", s, ok, err)
			}
		}
	})

	t.Run("write", func(t *testing.T) { // (c) the pattern laid out by Layout+Coder is md's data area
		mem := make([][]byte, c.members)
		for i := range mem {
			mem[i] = make([]byte, c.perMemberData)
		}
		for _, e := range l.Extents(nil, 0, c.arraySize) {
			copy(mem[e.Member][e.MemberOff:e.MemberOff+e.Len], pattern[e.BufOff:e.BufOff+e.Len])
		}
		shards := make([][]byte, c.members)
		for s := range c.stripes {
			for d := range l.DataMembers() {
				shards[d] = mem[l.DataMember(s, d)][s*c.chunk : (s+1)*c.chunk]
			}
			shards[c.members-1] = mem[l.ParityMember(s)][s*c.chunk : (s+1)*c.chunk]
			if err := coder.Encode(shards); err != nil {
				t.Fatal(err)
			}
		}
		for i := range mem {
			if j := firstDiff(mem[i], a.data(i)[:c.perMemberData]); j >= 0 {
				t.Errorf("member %d data area differs from md's at byte %d (stripe %d)", i, j, int64(j)/c.chunk)
			}
		}
	})

	t.Run("wrong-layout", func(t *testing.T) { // (d) the other layouts misread md's array
		for _, other := range allAlgorithms {
			if other == c.alg {
				continue
			}
			wrong, _ := a.wrongSectors(mustLayout(t, c.members, c.chunk, other), pattern)
			if wrong == 0 {
				t.Errorf("reading this %v array as %v gets every sector right: the test cannot tell layouts apart", c.alg, other)
			}
			t.Logf("read as %v: %d of %d sectors wrong", other, wrong, c.arraySize/512)
		}
		// And a wrong chunk size misreads it too.
		for _, chunk := range []int64{c.chunk / 2, c.chunk * 2} {
			wrong, _ := a.wrongSectors(mustLayout(t, c.members, chunk, c.alg), pattern)
			if wrong == 0 {
				t.Errorf("reading with chunk %d instead of %d gets every sector right", chunk, c.chunk)
			}
		}
	})
}

func md5Sum(b []byte) []byte {
	s := md5.Sum(b)
	return s[:]
}

// firstDiff returns the index of the first differing byte of a and b, or -1.
func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}
