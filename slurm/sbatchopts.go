package slurm

import (
	"fmt"
	"strings"
)

// A profile's sbatch lines go into the script as "#SBATCH <line>", and
// sbatch reads every word of such a line, not only the first: it splits
// the line at white space (space, tab, newline, vertical tab, form feed,
// carriage return), honours single and double quotes and backslash
// escapes, stops at an unquoted '#', and hands the words to getopt_long
// with its own option table (Slurm 22.05, src/sbatch/opt.c,
// _get_argument). A line that also names "hetjob" or "packjob" starts a
// heterogeneous job component. Validation reads each line the same way,
// so that an option the provisioner owns cannot hide in a line's second
// word ("--partition=x --array=1-100", "-p x -J y", "--time=5\v-J y").
//
// What it does not do: check that an option exists or that its value is
// good. That is Slurm's to say (sbatch --test-only), not ours.

// sbatchOpt is one option of a #SBATCH line as getopt would see it.
type sbatchOpt struct {
	// long is "--name" as written (getopt accepts unambiguous
	// abbreviations, so "--par" may be --partition); short is the letter
	// for a short option. One of the two is set.
	long  string
	short byte
	// value is the option's argument, when it has one.
	value    string
	hasValue bool
}

// shortWithArg are sbatch's short options that take an argument; the
// others it has (b h H O Q s u v V W, and k with an optional one) take
// none. From sbatch's getopt string in Slurm 22.05.
const shortWithArg = "aABcCdDeFGiJLmMnNopqStUwx"

// sbatchWords splits a #SBATCH line into words as sbatch does.
func sbatchWords(line string) []string {
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

// parseSbatchLine reads the options of one #SBATCH line. A word that is
// neither an option nor an option's argument is an error: sbatch would
// take it for the script's name or ignore it, and neither is what the
// profile meant.
func parseSbatchLine(line string) ([]sbatchOpt, error) {
	lower := strings.ToLower(line)
	if strings.Contains(lower, "hetjob") || strings.Contains(lower, "packjob") {
		return nil, fmt.Errorf("it names hetjob or packjob, which sbatch takes for the start of another job component")
	}
	words := sbatchWords(line)
	if words == nil && strings.ContainsAny(line, `"'`) {
		return nil, fmt.Errorf("a quote is not closed; sbatch would read the rest of the line as one word")
	}
	var opts []sbatchOpt
	for i := 0; i < len(words); i++ {
		w := words[i]
		switch {
		case strings.HasPrefix(w, "--") && len(w) > 2:
			name, value, has := strings.Cut(w, "=")
			o := sbatchOpt{long: name, value: value, hasValue: has}
			// A long option's argument may be the next word. Whether
			// this option takes one is sbatch's to know; taking the
			// next word when it is not an option errs on the side of
			// checking every word that starts with '-'.
			if !has && i+1 < len(words) && !strings.HasPrefix(words[i+1], "-") {
				o.value, o.hasValue = words[i+1], true
				i++
			}
			opts = append(opts, o)
		case strings.HasPrefix(w, "-") && len(w) > 1 && w[1] != '-':
			letters := w[1:]
			for j := 0; j < len(letters); j++ {
				c := letters[j]
				if !strings.ContainsRune(shortWithArg, rune(c)) {
					opts = append(opts, sbatchOpt{short: c})
					continue
				}
				o := sbatchOpt{short: c, hasValue: true}
				if rest := letters[j+1:]; rest != "" {
					o.value = rest
				} else if i+1 < len(words) {
					o.value = words[i+1]
					i++
				} else {
					o.hasValue = false
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

// is reports whether o is the long option long (abbreviated or not: getopt
// accepts any unambiguous prefix, so "--ar" is --array) or the short one.
func (o sbatchOpt) is(long string, short byte) bool {
	if o.long != "" {
		return len(o.long) > 2 && strings.HasPrefix(long, o.long)
	}
	return short != 0 && o.short == short
}

// sbatchOpts reads the options of all of a profile's lines; lines that do
// not parse (validation refuses them) contribute none.
func sbatchOpts(lines []string) []sbatchOpt {
	var all []sbatchOpt
	for _, l := range lines {
		opts, err := parseSbatchLine(l)
		if err == nil {
			all = append(all, opts...)
		}
	}
	return all
}
