# want: 3:22 Invalid escape sequence
engine {
  listen = "127.0.0.1\q:0"
}
