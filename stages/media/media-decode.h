/* media-decode.h — demux and decode video and audio with FFmpeg.
 *
 * Plain C module compiled into the decode stage and into tests. Uses no
 * libspindle symbol (spindle/status.h and spindle/image.h helpers only).
 *
 * A decoder reads one file (anything libavformat opens) and returns its
 * video frames and audio chunks in demux order, both with presentation
 * times in seconds as a rational (pts * tb_num / tb_den) relative to the
 * stream start. Video frames come in the pixel format asked for, turned
 * upright according to the stream's display matrix (90/180/270 degrees).
 * Audio comes as interleaved float32 at the asked rate and channel count
 * (libswresample). A segment (start, duration) seeks to the keyframe before
 * start and drops what lies outside [start, start + duration).
 * Every error message starts with the file path. Damage is an error unless
 * tolerate_errors is set: corrupt data, and a file that ends before the
 * duration its header declares ("in.mp4: truncated: video ends at 1.52 s of
 * 4.00 s"), never pass as a short success.
 */
#ifndef SPN_MEDIA_DECODE_H
#define SPN_MEDIA_DECODE_H

#include <stdint.h>

#include "spindle/image.h"
#include "spindle/status.h"
#include "media-log.h"

struct AVFormatContext;
struct AVIOContext;
struct AVDictionary;

typedef enum spn_hwaccel {
  SPN_HWACCEL_NONE = 0,
  SPN_HWACCEL_AUTO = 1,    /* CUDA when FFmpeg and the device allow, else software */
  SPN_HWACCEL_CUDA = 2,    /* CUDA or fail */
} spn_hwaccel_t;

typedef struct spn_decode_opts {
  int32_t pixfmt;          /* SPN_PIXFMT_RGB24 (default), BGR24, RGBF32P, BGRF32P, NV12, YUV420P */
  int32_t want_video;      /* default 1 */
  int32_t want_audio;      /* default 1; no audio stream is not an error */
  int32_t audio_rate;      /* 0 = the stream's */
  int32_t audio_channels;  /* 0 = the stream's */
  double start;            /* seconds, >= 0 */
  double duration;         /* seconds, <= 0 = to the end */
  int32_t hwaccel;         /* spn_hwaccel_t */
  int32_t autorotate;      /* default 1 */
  /* 0 (default): a corrupt packet or frame, or a stream that ends before
   * its declared duration (a truncated file), is an error naming the file,
   * the stream and the time. 1: corrupt packets are skipped and an early end
   * is accepted; spn_decode_info_t counts what was lost. */
  int32_t tolerate_errors;
  const spn_media_log_t *log; /* FFmpeg's messages for this file go here; borrowed, NULL: dropped */
  /* GPU decode (a decode stage placed on a CUDA device; media-cuda.h).
   * hw_device: an AVBufferRef * of an AV_HWDEVICE_TYPE_CUDA device the
   * caller made (spn_media_cuda_device_new: the stage's GPU, its primary
   * context and its stream); borrowed, the decoder takes its own reference.
   * NULL: with hwaccel auto/cuda FFmpeg opens its default CUDA device. Not
   * used with hwaccel none.
   * device_frames: 1 = a frame NVDEC decoded stays on the GPU: the item's
   * image is then an NV12 view of device memory held by item.hw_frame
   * (4:2:0 only: 8-bit NV12, or with item.deep the same planes of 16-bit
   * P010/P016 samples; a turn is left to the caller only with
   * device_rotate; other frames are downloaded as before, and
   * info.host_frames_why says why). Use it with hw_device: without one the
   * frames live in FFmpeg's own CUDA context, which the runtime's is not.
   * 0 = every frame is downloaded and converted on the CPU (the default).
   * device_rotate: 1 = the stream's rotation is not applied here: every
   * frame (on the device or not) comes as stored and item.rotation says the
   * clockwise turn the caller applies (info.width/height and info.rotation
   * still describe the upright picture). 0 (default): frames come upright. */
  void *hw_device;
  int32_t device_frames;
  int32_t device_rotate;
  /* Tests only (the fake GPU of tests/gpu/host-emu, which has no NVDEC):
   * with device_frames and emu_upload set, software-decoded 4:2:0 frames
   * are handed over as NVDEC's would be (hw_frame items: NV12, or P010/P016
   * for 10 and 12 bits) in device memory that emu_upload returns holding a
   * copy of `size` host bytes (NULL: out of memory), released with
   * emu_free, so the caller's device path runs on the fake GPU. NULL
   * (default): off. */
  void *(*emu_upload)(const void *host, size_t size);
  void (*emu_free)(void *opaque, uint8_t *data);
  /* 0 (default): a local file is read as the one file it is: a demuxer
   * that would open another file or URL on its behalf (an HLS or DASH
   * playlist, a concat list, a QuickTime reference to external media) is
   * refused, naming what it asked for (SPN_EMEDIA). A job's inputs are
   * checked against the job service's roots by path; without this a
   * playlist inside the roots would read files outside them. 1: FFmpeg
   * follows such references (a user's own playlist in `spindle run`).
   * URLs ("scheme://...") are FFmpeg's either way. */
  int32_t follow_references;
  /* With want_video 0: 1 = a file with no audio stream opens, info.has_audio
   * 0 (spn_decoder_next ends at once); 0 (default): it is refused, naming
   * the file ("no audio stream"). */
  int32_t audio_optional;
} spn_decode_opts_t;

#define SPN_DECODE_OPTS_INIT {SPN_PIXFMT_RGB24, 1, 1, 0, 0, 0.0, 0.0, SPN_HWACCEL_NONE, 1, 0, NULL, NULL, 0, 0, NULL, NULL, 0, 0}

typedef struct spn_decode_info {
  int32_t has_video, has_audio;
  int32_t width, height;        /* output size (after rotation; RGB and float: in square pixels, below) */
  /* The stored pixels' shape (sample aspect ratio, in lowest terms; 1:1
   * when the file says none). RGB and float frames of a file whose pixels
   * are not square (an anamorphic DVD or DV video: 720x480 shown 16:9) are
   * resampled to square pixels, widened (or, for pixels taller than wide,
   * heightened) to the shape the file is shown in: models see faces as
   * they are. 4:2:0 frames come as stored, and decode's image item carries
   * the ratio for encode to record (inverted for frames turned a quarter:
   * 4:3 pixels turned upright are 3:4). */
  int32_t sar_num, sar_den;
  int32_t rotation;             /* degrees clockwise applied to frames */
  int32_t fps_num, fps_den;     /* the stream's average (or guessed) rate */
  double duration;              /* seconds, container's; 0 if unknown */
  int32_t audio_rate, audio_channels; /* output audio format */
  int32_t hwaccel_active;       /* 1 when frames are decoded on CUDA */
  /* With device_frames: NULL while frames come on the device; else a static
   * phrase saying why frames come in host memory ("the decoder has no CUDA
   * hwaccel", "NVDEC refused the stream: FFmpeg decodes it in software", ...). */
  const char *host_frames_why;
  const char *video_codec;      /* static names from libavcodec */
  const char *audio_codec;
  /* Filled as decoding goes (final at SPN_EOS); with tolerate_errors these
   * say what was accepted. */
  int64_t corrupt_packets;      /* packets or frames the decoders refused or flagged */
  int32_t truncated;            /* a stream ended before its declared duration */
  double video_end, video_expected; /* seconds: where video ended / should have */
  /* The video's colour as the file records it (H.273 codes, as FFmpeg's
   * AVColorSpace etc.): matrix 0 when it says none (read as BT.601, as
   * FFmpeg and the programs that write such files do); primaries and
   * transfer 2 when unsaid. full_range: 0 limited, 1 full. */
  int32_t matrix, full_range, primaries, transfer;
  /* 1: the video is HDR (transfer PQ or HLG) and RGB/float frames are
   * tone-mapped to SDR BT.709 (media-tonemap.h); 4:2:0 frames never are */
  int32_t tone_mapped;
} spn_decode_info_t;

typedef enum spn_media_kind { SPN_MEDIA_VIDEO = 1, SPN_MEDIA_AUDIO = 2 } spn_media_kind_t;

typedef struct spn_media_item {
  int32_t kind;                 /* spn_media_kind_t */
  int64_t index;                /* video: 0,1,2... of frames returned; audio: chunk count */
  int64_t pts;                  /* in tb units */
  int32_t tb_num, tb_den;
  double pts_sec;
  spn_image_t image;            /* video: owns its buffer (or, with hw_frame, views device memory) */
  void *hw_frame;               /* device_frames: the AVFrame * (AV_PIX_FMT_CUDA, NV12) image views; owned */
  int32_t deep;                 /* with hw_frame: the planes hold 16-bit P010/P016 samples, not NV12's bytes */
  int32_t rotation;             /* device_rotate: clockwise degrees the caller turns the image by; else 0 */
  spn_colour_t colour;          /* video: the matrix and range of its 4:2:0 samples (an NV12/YUV420P
                                 * image or hw_frame: the file's; RGB was converted from them with it) */
  int32_t tone_map;             /* with hw_frame, for RGB/float pixfmts: the HDR transfer (SPN_TRANSFER_PQ
                                 * or _HLG) the caller tone-maps from (spn_media_cuda_from_item); else 0 */
  int32_t show_w, show_h;       /* with hw_frame: the size (before any turn) the caller resamples RGB/float
                                 * frames to, square pixels (the image's own when they are square) */
  float *samples;               /* audio: interleaved float32, owned */
  int64_t n_samples;            /* per channel */
  int32_t channels, rate;
} spn_media_item_t;

/* Meta items the decode stage adds to its messages and encode reads
 * (plain structs in native byte order: a pipeline runs on one machine). */
#define SPN_MEDIA_IMAGE_META "image"
typedef struct spn_media_image_meta {
  int32_t width, height, format;   /* spn_pixfmt_t */
  int32_t matrix, full_range;      /* the samples' colour (spn_colour_t): encode records it */
  int32_t primaries, transfer;     /* the source's (H.273; 2: unsaid), recorded as they are */
  int32_t sar_num, sar_den;        /* the pixels' shape (1:1 square; 0: unknown, square) */
} spn_media_image_meta_t;
#define SPN_MEDIA_AUDIO_META "audio_format"
typedef struct spn_media_audio_meta {
  int32_t rate, channels;          /* channels 0: the job has no audio */
} spn_media_audio_meta_t;

typedef struct spn_decoder spn_decoder_t;

/* Whether the video is HDR (PQ or HLG transfer): 1 with "HLG transfer,
 * bt2020 primaries" (or the like) in buf; else 0. Thread: any. */
int32_t spn_decode_hdr(const spn_decode_info_t *info, char *buf, size_t n);

/* A local input path names a regular file (or is not there: the opener
 * says so). A named pipe, a device, a socket or a folder is refused with
 * what it is: opening a pipe that nobody writes blocks in the kernel, where
 * neither a cancel nor SIGTERM reaches it. URLs ("scheme://...") are left
 * to FFmpeg. Thread: any. */
int32_t spn_media_check_input(const char *path, spn_error_t *err);

/* The opening of one local input file (follow_references above): set up
 * on a freshly allocated AVFormatContext before avformat_open_input. The
 * struct must outlive the context (demuxers open segments as they read);
 * the context's `opaque` points at it, and FFmpeg's log messages still
 * reach `log` (media-log.h: the struct starts with it). */
typedef struct spn_media_input {
  spn_media_log_t log;        /* first: media-log reads the context's opaque as this */
  spn_media_log_t owner;      /* where log's messages go (fn NULL: dropped) */
  const char *url;            /* the one file it may open; borrowed */
  int (*io_open)(struct AVFormatContext *s, struct AVIOContext **pb, const char *url, int flags,
                 struct AVDictionary **options); /* FFmpeg's own */
  char refused[512];          /* the first other file or URL asked for, "" if none */
  int whitelisted;            /* the context's format and protocol whitelists are ours */
} spn_media_input_t;

/* Claim fmt for path: FFmpeg's messages go to log (may be NULL), and
 * unless follow_references (or path names a protocol other than "file",
 * as a URL or "pipe:0" does): the demuxers that read other files or URLs
 * (playlists, manifests, lists, session descriptions, scripts) are left
 * out of fmt's format whitelist, its protocols are "file" only, and any
 * open of a file but path fails with EPERM and is recorded in
 * in->refused. SPN_ENOMEM is the only error. */
int32_t spn_media_input_guard(spn_media_input_t *in, struct AVFormatContext *fmt, const char *path,
                              const spn_media_log_t *log, int follow_references, spn_error_t *err);

/* After a failed open or read: when the guard refused what the file asked
 * for, or (at_open: avformat_open_input failed) the file is of a format
 * the guard keeps out, which is then probed from its first bytes, set err
 * to say so (SPN_EMEDIA: the file's content asked for it) and return that
 * status; else SPN_OK. */
int32_t spn_media_input_refused(const spn_media_input_t *in, const char *path, int at_open, spn_error_t *err);

/* The status for an FFmpeg error: SPN_ENOMEM, SPN_ENOENT, SPN_EIO for what
 * the system says (a read or write that failed, a full disk, a lost network
 * share: another attempt may succeed), SPN_EMEDIA for what the media or the
 * settings are (invalid data, no decoder, a bad parameter: the same again
 * on any worker; a job that fails with it is not retried, docs/jobs.md). */
int32_t spn_media_av_status(int averr);

/* Open path. Ownership: caller owns *out (spn_decoder_free). Thread: any;
 * one decoder is used by one thread at a time. */
int32_t spn_decoder_new(const char *path, const spn_decode_opts_t *opts, spn_decoder_t **out,
                        spn_error_t *err);
void spn_decoder_free(spn_decoder_t *dec);
const spn_decode_info_t *spn_decoder_info(const spn_decoder_t *dec);

/* Next item in demux order: SPN_OK with *item filled (release it with
 * spn_media_item_release), SPN_EOS at the end, or an error. */
int32_t spn_decoder_next(spn_decoder_t *dec, spn_media_item_t *item, spn_error_t *err);
void spn_media_item_release(spn_media_item_t *item);

#endif
