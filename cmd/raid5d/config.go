package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/stripe/cache"
)

// The serve configuration file is TOML with one flat table: every key is the name of a serve
// flag (listen, tls-cert, stripe-cache, ...) and means what the flag means, plus members, the
// list of member paths. One name per setting, on the command line and in the file, so nothing
// has to be learnt twice and no key can drift from its flag: a new flag is a new key.
//
// Values take the TOML type of the setting: booleans for switches (stable-pages = true),
// integers for counts (max-connections = 64), strings for everything else (durations "30s",
// sizes "64M" or plain integers, paths); repeatable flags (allow-client, allow-uid) take an
// array. Relative paths (members, socket, control, journal, tls-*, member-tls-*; the PATH of
// a member or journal spec, a member URI's socket= and tls-certificates=) are relative to the
// file's directory.
// A flag given on the command line wins over the file; the file wins over the defaults.

// configMembersKey is the one key that is not a flag: the member paths.
const configMembersKey = "members"

// isPathKey reports whether a serve flag names a file, so that a relative value in a
// configuration file is taken relative to the file's directory.
func isPathKey(name string) bool {
	switch name {
	case "socket", "control", "tls-cert", "tls-key", "tls-client-ca", "journal",
		"member-tls-ca", "member-tls-cert", "member-tls-key":
		return true
	}
	return false
}

// notConfigKey reports whether a serve flag has no configuration key: the flags about the
// configuration file itself, and the one-off recoveries that must not stay set in a file
// (--force left in a file would force every later failure through without a decision).
func notConfigKey(name string) bool {
	return name == "config" || name == "print-config" || name == "skip-corrupt-journal" || name == "force"
}

// settingSource says where an effective setting came from, for --print-config.
type settingSource map[string]string

// applyConfigFile reads the configuration file at path and sets every flag it names that the
// command line did not set (fs must be parsed already). It returns the members it lists,
// made absolute against the file's directory, and where each setting now comes from. An
// unknown key, a value of the wrong type or one its flag refuses is a usage error naming the
// file, the line and the key.
func applyConfigFile(path string, fs *flag.FlagSet) ([]string, settingSource, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("--config: %w", err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, nil, fmt.Errorf("--config: %w", err)
	}
	dir := filepath.Dir(abs)
	src := settingSource{}
	fs.Visit(func(f *flag.Flag) { src[f.Name] = "command line" })

	var values map[string]any
	md, err := toml.Decode(string(data), &values)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return nil, nil, fmt.Errorf("%w: config %s line %d: %s", errUsage, path, pe.Position.Line, pe.Message)
		}
		return nil, nil, fmt.Errorf("%w: config %s: %v", errUsage, path, err)
	}
	lines := strings.Split(string(data), "\n")
	var members []string
	for _, key := range md.Keys() {
		name := key[0]
		at := fmt.Sprintf("config %s line %d", path, keyLine(lines, key))
		if len(key) > 1 {
			return nil, nil, fmt.Errorf("%w: %s: %q: the file is one flat table of serve flags (no tables or dotted keys)", errUsage, at, key.String())
		}
		v := values[name]
		if name == configMembersKey {
			list, err := stringArray(v)
			if err != nil {
				return nil, nil, fmt.Errorf("%w: %s: members: %v", errUsage, at, err)
			}
			for _, m := range list {
				members = append(members, resolveMember(dir, m))
			}
			src[configMembersKey] = abs
			continue
		}
		f := fs.Lookup(name)
		if f == nil || notConfigKey(name) {
			return nil, nil, fmt.Errorf("%w: %s: unknown key %q%s", errUsage, at, name, suggestKey(fs, name))
		}
		if _, ok := v.(map[string]any); ok {
			return nil, nil, fmt.Errorf("%w: %s: %q is a table; the file has one flat table of serve flags", errUsage, at, name)
		}
		if src[name] == "command line" {
			continue
		}
		strs, err := flagStrings(f, v)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: %s: %s: %v", errUsage, at, name, err)
		}
		for _, s := range strs {
			switch {
			case name == "journal" && s != "":
				s = resolveMember(dir, s) // a path, or the PATH of a volatile: spec
			case isPathKey(name) && s != "" && !filepath.IsAbs(s):
				s = filepath.Join(dir, s)
			}
			if err := fs.Set(name, s); err != nil {
				return nil, nil, fmt.Errorf("%w: %s: %s = %q: %v", errUsage, at, name, s, err)
			}
		}
		src[name] = abs
	}
	return members, src, nil
}

// resolveMember makes a member or journal path from a configuration file absolute against
// dir; in a faulty:PATH?... or volatile:PATH?... spec, the PATH.
func resolveMember(dir, m string) string {
	resolved, _ := raid.MapSpecPath(m, func(p string) (string, error) {
		if filepath.IsAbs(p) {
			return p, nil
		}
		return filepath.Join(dir, p), nil
	})
	return resolved
}

// isRepeatable reports whether a flag takes many values (given again on the command line, an
// array in the file).
func isRepeatable(f *flag.Flag) bool {
	switch f.Value.(type) {
	case *stringList, *intList:
		return true
	}
	return false
}

func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// flagStrings turns a TOML value into the strings to Set its flag with: a boolean for a switch,
// an array (or one value) for a repeatable flag, a string or an integer for the others.
func flagStrings(f *flag.Flag, v any) ([]string, error) {
	if isBoolFlag(f) {
		b, ok := v.(bool)
		if !ok {
			return nil, fmt.Errorf("want true or false, got %s", tomlTypeName(v))
		}
		return []string{strconv.FormatBool(b)}, nil
	}
	scalar := func(v any) (string, error) {
		switch x := v.(type) {
		case string:
			return x, nil
		case int64:
			return strconv.FormatInt(x, 10), nil
		}
		return "", fmt.Errorf("want a string or an integer, got %s", tomlTypeName(v))
	}
	if arr, ok := v.([]any); ok {
		if !isRepeatable(f) {
			return nil, fmt.Errorf("takes one value, got an array")
		}
		out := make([]string, 0, len(arr))
		for _, e := range arr {
			s, err := scalar(e)
			if err != nil {
				return nil, err
			}
			out = append(out, s)
		}
		return out, nil
	}
	s, err := scalar(v)
	if err != nil {
		return nil, err
	}
	return []string{s}, nil
}

func stringArray(v any) ([]string, error) {
	arr, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("want an array of paths, got %s", tomlTypeName(v))
	}
	out := make([]string, 0, len(arr))
	for _, e := range arr {
		s, ok := e.(string)
		if !ok || s == "" {
			return nil, fmt.Errorf("want an array of paths, found %s", tomlTypeName(e))
		}
		out = append(out, s)
	}
	return out, nil
}

func tomlTypeName(v any) string {
	switch x := v.(type) {
	case string:
		return fmt.Sprintf("the string %q", x)
	case int64:
		return fmt.Sprintf("the integer %d", x)
	case float64:
		return fmt.Sprintf("the float %v", x)
	case bool:
		return fmt.Sprintf("the boolean %v", x)
	case []any:
		return "an array"
	case map[string]any:
		return "a table"
	case time.Time:
		return "a date"
	}
	return fmt.Sprintf("a %T", v)
}

// keyLine returns the 1-based line where key is defined in the file's lines (its first
// appearance as key = or as a [table] header), or 0 if it cannot tell.
func keyLine(lines []string, key toml.Key) int {
	name := regexp.QuoteMeta(key[0])
	re := regexp.MustCompile(`^\s*(?:\[\[?\s*)?(?:` + name + `|"` + name + `"|'` + name + `')\s*[=.\]]`)
	for i, l := range lines {
		if re.MatchString(l) {
			return i + 1
		}
	}
	return 0
}

// suggestKey returns ` (did you mean "x"?)` for the serve flag closest to an unknown key (an
// underscore for a dash, or a typo of a letter or two), or "".
func suggestKey(fs *flag.FlagSet, name string) string {
	best, bestD := "", 3
	fs.VisitAll(func(f *flag.Flag) {
		if notConfigKey(f.Name) {
			return
		}
		if d := editDistance(strings.ReplaceAll(name, "_", "-"), f.Name); d < bestD {
			best, bestD = f.Name, d
		}
	})
	if d := editDistance(name, configMembersKey); d < bestD {
		best = configMembersKey
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// printConfig writes the effective settings as a configuration file serve can read back:
// members and every setting from the command line or a file as key = value with where it
// came from, and every other setting commented out with its default.
func printConfig(w io.Writer, fs *flag.FlagSet, members []string, src settingSource) error {
	var b strings.Builder
	b.WriteString("# raid5d serve: effective settings (command line over configuration file over defaults)\n\n")
	if len(members) > 0 {
		quoted := make([]string, len(members))
		for i, m := range members {
			quoted[i] = tomlString(m)
		}
		from := src[configMembersKey]
		if from == "" {
			from = "command line"
		}
		fmt.Fprintf(&b, "members = [%s]  # %s\n", strings.Join(quoted, ", "), from)
	} else {
		b.WriteString("# members = []  # none given\n")
	}
	var names []string
	fs.VisitAll(func(f *flag.Flag) {
		if !notConfigKey(f.Name) {
			names = append(names, f.Name)
		}
	})
	slices.Sort(names)
	for _, name := range names {
		f := fs.Lookup(name)
		if from, ok := src[name]; ok {
			fmt.Fprintf(&b, "%s = %s  # %s\n", name, tomlValue(f), from)
			continue
		}
		v := tomlValue(f)
		if d, ok := builtinDefault(name, fs); ok {
			v = d
		}
		fmt.Fprintf(&b, "# %s = %s  # default\n", name, v)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// builtinDefault is the value a setting left at its zero value stands for, where the flag's
// zero means "the built-in default" (of the raid package, or derived from other settings).
func builtinDefault(name string, fs *flag.FlagSet) (string, bool) {
	switch name {
	case "member-timeout":
		return tomlString(raid.DefaultMemberTimeout.String()), true
	case "read-error-limit":
		return strconv.Itoa(raid.DefaultReadErrorLimit), true
	case "sync-speed-min":
		return tomlString(formatSize(raid.DefaultSyncSpeedMin)), true
	case "sync-speed-max":
		return tomlString(formatSize(raid.DefaultSyncSpeedMax)), true
	case "write-back-delay":
		return tomlString(cache.DefaultWriteBackDelay.String()), true
	case "stripe-cache":
		return tomlString(formatSize(raid.DefaultCacheBytes)), true
	case "control":
		if e := fs.Lookup("export"); e != nil {
			return tomlString(defaultControlPath(e.Value.String())), true
		}
	}
	return "", false
}

// tomlValue writes a flag's current value in TOML: a boolean, an integer, an array for a
// repeatable flag, else a string.
func tomlValue(f *flag.Flag) string {
	switch v := f.Value.(type) {
	case *stringList:
		out := make([]string, len(*v))
		for i, s := range *v {
			out[i] = tomlString(s)
		}
		return "[" + strings.Join(out, ", ") + "]"
	case *intList:
		return "[" + strings.ReplaceAll(v.String(), ",", ", ") + "]"
	}
	if g, ok := f.Value.(flag.Getter); ok {
		switch x := g.Get().(type) {
		case bool:
			return strconv.FormatBool(x)
		case int:
			return strconv.Itoa(x)
		case int64:
			return strconv.FormatInt(x, 10)
		case uint64:
			return strconv.FormatUint(x, 10)
		}
	}
	return tomlString(f.Value.String())
}

// tomlString quotes s as a TOML basic string.
func tomlString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, "\\u%04X", r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}
