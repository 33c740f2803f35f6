# want: 6:13 looked for @PLUGIN_DIR@/provisioner-kubernetes
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "kubernetes" "k8s" {
  namespace = "default"
}
