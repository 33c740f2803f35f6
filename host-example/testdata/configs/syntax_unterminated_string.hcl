# want: 3:24 Unterminated template string
engine {
  listen = "127.0.0.1:0
}
