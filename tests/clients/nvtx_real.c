/* Uses the real NVTX v3 headers (PyPI nvidia-nvtx): its own loader finds the injection through
 * NVTX_INJECTION64_PATH. */
#include <nvtx3/nvToolsExt.h>

int main(void) {
    nvtxRangePushA("outer");
    nvtxMarkA("inside");
    nvtxEventAttributes_t a = {0};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = "with attributes";
    nvtxRangePushEx(&a);
    nvtxRangePop();
    nvtxRangePop();
    nvtxRangeId_t id = nvtxRangeStartA("start to end");
    nvtxRangeEnd(id);
    return 0;
}
