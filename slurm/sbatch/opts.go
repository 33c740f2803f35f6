package sbatch

import (
	"fmt"
	"strings"
)

// Opt is one option of a #SBATCH line as getopt would see it.
type Opt struct {
	// Long is "--name" as written (getopt accepts unambiguous
	// abbreviations, so "--par" may be --partition); Short is the letter
	// for a short option. One of the two is set.
	Long  string
	Short byte
	// Value is the option's argument, when it has one (HasValue).
	Value    string
	HasValue bool
}

// shortWithArg are sbatch's short options that take an argument; the
// others it has (b h H O Q s u v V W, and k with an optional one) take
// none. From sbatch's getopt string in Slurm 22.05.
const shortWithArg = "aABcCdDeFGiJLmMnNopqStUwx"

// Words splits a #SBATCH line into words as sbatch does: at C's white
// space, with quotes, backslash escapes and an unquoted '#' starting a
// comment. It is nil for a line whose quote is not closed.
func Words(line string) []string {
	var words []string
	var cur strings.Builder
	inWord, escaped := false, false
	var quote byte
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case escaped:
			escaped = false
			cur.WriteByte(c)
			inWord = true
			continue
		case c == '\\':
			escaped, inWord = true, true
			continue
		case quote != 0:
			if c == quote {
				quote = 0
			} else {
				cur.WriteByte(c)
			}
			continue
		case c == '#':
			i = len(line) // the rest is a comment
			continue
		case c == '"' || c == '\'':
			quote, inWord = c, true
			continue
		case isCSpace(c):
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
			continue
		}
		cur.WriteByte(c)
		inWord = true
	}
	if inWord {
		words = append(words, cur.String())
	}
	if quote != 0 {
		// sbatch takes the rest of the line; refuse rather than guess.
		return nil
	}
	return words
}

// isCSpace is C's isspace in the C locale, which sbatch uses.
func isCSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'
}

// ParseLine reads the options of one #SBATCH line. A word that is
// neither an option nor an option's argument is an error: sbatch would
// take it for the script's name or ignore it, and neither is what the
// profile meant.
func ParseLine(line string) ([]Opt, error) {
	lower := strings.ToLower(line)
	if strings.Contains(lower, "hetjob") || strings.Contains(lower, "packjob") {
		return nil, fmt.Errorf("it names hetjob or packjob, which sbatch takes for the start of another job component")
	}
	words := Words(line)
	if words == nil && strings.ContainsAny(line, `"'`) {
		return nil, fmt.Errorf("a quote is not closed; sbatch would read the rest of the line as one word")
	}
	var opts []Opt
	for i := 0; i < len(words); i++ {
		w := words[i]
		switch {
		case strings.HasPrefix(w, "--") && len(w) > 2:
			name, value, has := strings.Cut(w, "=")
			o := Opt{Long: name, Value: value, HasValue: has}
			// A long option's argument may be the next word. Whether
			// this option takes one is sbatch's to know; taking the
			// next word when it is not an option errs on the side of
			// checking every word that starts with '-'.
			if !has && i+1 < len(words) && !strings.HasPrefix(words[i+1], "-") {
				o.Value, o.HasValue = words[i+1], true
				i++
			}
			opts = append(opts, o)
		case strings.HasPrefix(w, "-") && len(w) > 1 && w[1] != '-':
			letters := w[1:]
			for j := 0; j < len(letters); j++ {
				c := letters[j]
				if !strings.ContainsRune(shortWithArg, rune(c)) {
					opts = append(opts, Opt{Short: c})
					continue
				}
				o := Opt{Short: c, HasValue: true}
				if rest := letters[j+1:]; rest != "" {
					o.Value = rest
				} else if i+1 < len(words) {
					o.Value = words[i+1]
					i++
				} else {
					o.HasValue = false
				}
				opts = append(opts, o)
				break
			}
		default:
			return nil, fmt.Errorf("%q is not an sbatch option; write options as they would follow #SBATCH, such as --partition=debug", w)
		}
	}
	return opts, nil
}

// Is reports whether o is the long option long (abbreviated or not: getopt
// accepts any unambiguous prefix, so "--ar" is --array) or the short one
// (0 for none).
func (o Opt) Is(long string, short byte) bool {
	if o.Long != "" {
		return len(o.Long) > 2 && strings.HasPrefix(long, o.Long)
	}
	return short != 0 && o.Short == short
}

// Name is the option as written: "--name" for a long one, "-x" for a
// short one.
func (o Opt) Name() string {
	if o.Long != "" {
		return o.Long
	}
	return "-" + string(o.Short)
}

// Opts reads the options of all of the lines; lines that do not parse
// (validation refuses them) contribute none.
func Opts(lines []string) []Opt {
	var all []Opt
	for _, l := range lines {
		opts, err := ParseLine(l)
		if err == nil {
			all = append(all, opts...)
		}
	}
	return all
}
