// Checks whether UCX (1.13, Debian's libucx-dev) lets a put through a remote key
// land after the target unmapped the memory handle (docs/transfer.md, "Why not UCX").
// Not part of the build: gcc -O1 -o /tmp/ucx_rkey_check bench/ucx_rkey_check.c $(pkg-config --cflags --libs ucx)
// then /tmp/ucx_rkey_check tcp; /tmp/ucx_rkey_check sm
// Does a UCX put through an rkey land after the target unmapped the memory handle?
#include <ucp/api/ucp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>
#include <sys/mman.h>
#include <poll.h>

static ucp_context_h ctx; static ucp_worker_h w;
static void init(const char* tls) {
  ucp_config_t* cfg; ucp_config_read(NULL, NULL, &cfg);
  ucp_config_modify(cfg, "TLS", tls);
  ucp_params_t p = {0}; p.field_mask = UCP_PARAM_FIELD_FEATURES; p.features = UCP_FEATURE_RMA;
  if (ucp_init(&p, cfg, &ctx) != UCS_OK) { printf("init fail\n"); exit(1); }
  ucp_config_release(cfg);
  ucp_worker_params_t wp = {0}; wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE; wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_create(ctx, &wp, &w);
}
static void wr(int fd, const void* b, size_t n) { if (write(fd, &n, sizeof n) != sizeof n || write(fd, b, n) != (ssize_t)n) exit(2); }
static void* rd(int fd, size_t* n) { if (read(fd, n, sizeof *n) != sizeof *n) exit(3); void* b = malloc(*n); size_t g = 0; while (g < *n) { ssize_t r = read(fd, (char*)b + g, *n - g); if (r <= 0) exit(4); g += r; } return b; }
static void wait_readable(int fd) { for (;;) { ucp_worker_progress(w); struct pollfd p = {fd, POLLIN, 0}; if (poll(&p, 1, 0) > 0) return; usleep(50); } }
static void progress_for(double s) { for (int i = 0; i < (int)(s * 10000); i++) { ucp_worker_progress(w); usleep(100); } }
int main(int argc, char** argv) {
  const char* tls = argc > 1 ? argv[1] : "tcp";
  setvbuf(stdout, NULL, _IONBF, 0);
  int a[2], b[2]; pipe(a); pipe(b);
  // shared result page so the parent can see the target's buffer after unmap
  pid_t pid = fork();
  init(tls);
  if (pid == 0) {  // target
    char* buf = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(buf, 0, 1 << 20);
    ucp_mem_map_params_t mp = {0}; mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = buf; mp.length = 1 << 20; ucp_mem_h mh; ucp_mem_map(ctx, &mp, &mh);
    void* rk; size_t rks; ucp_rkey_pack(ctx, mh, &rk, &rks);
    ucp_address_t* addr; size_t al; ucp_worker_get_address(w, &addr, &al);
    wr(a[1], addr, al); wr(a[1], rk, rks); uint64_t base = (uint64_t)buf; wr(a[1], &base, 8);
    size_t n; wait_readable(b[0]); free(rd(b[0], &n));  // "first put done"
    progress_for(0.5);
    printf("target: after first put buf[0]=%d\n", buf[0]);
    ucp_mem_unmap(ctx, mh);
    memset(buf, 0, 1 << 20);
    wr(a[1], "u", 1);
    wait_readable(b[0]); free(rd(b[0], &n));  // "second put done"
    progress_for(1.0);
    printf("target: after put through the old rkey (mem unmapped) buf[0]=%d  -> %s\n", buf[0], buf[0] ? "LANDED" : "refused/nothing");
    fflush(stdout);
    _exit(0);
  }
  size_t al, rks, n; void* addr = rd(a[0], &al); void* rk = rd(a[0], &rks); uint64_t* base = rd(a[0], &n);
  ucp_ep_params_t ep = {0}; ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS; ep.address = addr; ucp_ep_h e;
  if (ucp_ep_create(w, &ep, &e) != UCS_OK) { printf("ep fail\n"); return 1; }
  ucp_rkey_h rkey; if (ucp_ep_rkey_unpack(e, rk, &rkey) != UCS_OK) { printf("unpack fail\n"); return 1; }
  char src[4096]; memset(src, 7, sizeof src);
  for (int round = 0; round < 2; round++) {
    ucp_request_param_t rp = {0};
    ucs_status_ptr_t r = ucp_put_nbx(e, src, sizeof src, *base, rkey, &rp);
    if (UCS_PTR_IS_PTR(r)) { while (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(w); printf("client: put %d status %s\n", round, ucs_status_string(ucp_request_check_status(r))); ucp_request_free(r); }
    else printf("client: put %d immediate status %s\n", round, ucs_status_string(UCS_PTR_STATUS(r)));
    ucs_status_ptr_t f = ucp_worker_flush_nbx(w, &rp);
    if (UCS_PTR_IS_PTR(f)) { while (ucp_request_check_status(f) == UCS_INPROGRESS) ucp_worker_progress(w); ucp_request_free(f); }
    wr(b[1], "d", 1);
    if (round == 0) { wait_readable(a[0]); free(rd(a[0], &n)); }  // wait for unmap
    progress_for(0.3);
  }
  int st; waitpid(pid, &st, 0);
  return 0;
}
